"""How `clp niah` reads a needle episode (niah's own helper, not a study: `experiments/studies/niah.py`
holds the config, the members and their summary; tests/test_layering.py's STUDY_SHARED lets it
import this module).

    answer, rank = read_iteratively(model, episode, 3, rule, memory, autocast)   # 3-iter
    answer, where = read_in_pass(model, episode, rule, memory, autocast)         # the ordinary mode
    result = read_episodes(model, exp, rule, source, tokenizer, precision)       # every episode, every reading
    loss = finetune(model, exp, rule, source, tokenizer, seed, precision)        # slow weights on needle episodes
    token_accuracy(hits), by_flag(hits, shared, True), name_guess(counts)        # what the readings add up to

n-iter reading, per episode, from the model's own memory as trained (restored before every
episode, so no episode reads another's writes): n − 1 extra reads of the haystack, each ending
with one write over the whole context (the write rule's chunk set to the haystack's length), then
the final read of haystack + question with writes off, where the answer is scored: n reads and
n − 1 writes, asserted on every FwPKM layer's counters (`FwPKM.calls`, `FwPKM.writes`). In-pass:
one read of haystack + question writing every `chunk` tokens as it goes (the pretraining write
rule), with where the question reads against where each needle wrote
(`analysis.memory_inspect.addresses`). `exp` is a `niah.NeedleExperiment`, read by its fields.

Fine-tuning: each training episode is laid out as `haystack haystack question answer` in one
sequence with writes every haystack-length tokens, so the question reads a memory written from two
reads of the haystack (as in 3-iter) and the gradient reaches the write path through the writes (a
write in an earlier forward is detached, so training on separate reads could not teach the
writing); loss on the answer tokens only. One sequence per forward
(`LMModule(sequences_per_forward=1)`), each forward starting from the base's memory, which is also
what evaluation starts from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from typing import Any, Sequence

from analysis.intervals import mean_of
from analysis.memory_inspect import addresses


def read_iteratively(model, episode, n: int, rule, memory, autocast, writes: Sequence[int] | None = None,
                     patch: bool = False) -> tuple[list[bool], int]:
    """n-iter reading of one episode from memory state `memory`: n − 1 reads of the haystack, each
    with one write over the whole context, then haystack + question with writes off, once per
    needle with that needle's number as the answer (one batch: the memory is the same for all).
    Returns (which answer tokens are the model's top-1, teacher forced: exact match is all of
    them; rank of the asked needle's number among the needles' numbers by log-likelihood, 1 =
    first); raises if any FwPKM layer did not read n times and write n − 1
    times (0 times if `writes` leaves it out)."""
    import torch

    hay = torch.tensor(episode.haystack)[None]
    full = candidate_batch(episode)
    layers = model.fwpkm_layers()
    model.restore_memory(memory)
    model.set_write_rules(dataclasses.replace(rule, chunk=hay.shape[1], persistence="persist"))
    for layer in layers:
        layer.reset_counters()
    with torch.no_grad(), autocast:
        model.set_writes(True, writes)
        writing = [layer.writes_enabled for layer in layers]
        for _ in range(n - 1):
            model(hay)
        model.set_writes(False)
        with patched(model, episode, patch):
            logits = model(full)
    for layer, wrote in zip(layers, writing):
        if (layer.calls, layer.writes) != (n, n - 1 if wrote else 0):
            raise AssertionError(f"{layer.name}: {n}-iter read {layer.calls} times and wrote {layer.writes} times")
    return _answer_hits(logits[episode.asked:episode.asked + 1, :full_length(episode, episode.asked)], episode), \
        _rank(logits, episode)


def full_length(episode, j: int) -> int:
    """Input length of candidate j: haystack + question + its number's tokens but the last."""
    return len(episode.haystack) + len(episode.question) + len(episode.candidates[j]) - 1


def candidate_batch(episode):
    """(needles, T): haystack + question + each needle's number (but its last token), padded at
    the end with the last token (causal attention: padding changes no earlier position)."""
    import torch

    rows = [episode.haystack + episode.question + c[:-1] for c in episode.candidates]
    width = max(map(len, rows))
    return torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows])


def _rank(logits, episode) -> int:
    """1 + how many needles' numbers the model finds likelier than the asked one's (teacher forced)."""
    import torch

    start = len(episode.haystack) + len(episode.question) - 1  # predicts the number's first token
    lls = []
    for j, c in enumerate(episode.candidates):
        logp = torch.log_softmax(logits[j, start:start + len(c)].float(), dim=-1)
        lls.append(float(logp[torch.arange(len(c)), torch.tensor(c)].sum()))
    return 1 + sum(ll > lls[episode.asked] for ll in lls)


def read_in_pass(model, episode, rule, memory, autocast, writes: Sequence[int] | None = None,
                 patch: bool = False) -> tuple[list[bool], dict[str, dict[str, Any]]]:
    """One read of haystack + question writing every `rule.chunk` tokens (the ordinary mode);
    which answer tokens are the model's top-1 (teacher forced), and per FwPKM layer where the
    question reads against where the needles wrote (`addresses`)."""
    import torch

    full = torch.tensor(episode.haystack + episode.question + episode.answer[:-1])[None]
    model.restore_memory(memory)
    model.set_write_rules(dataclasses.replace(rule, persistence="persist"))
    model.set_writes(True, writes)
    picks: dict[str, tuple[Any, Any]] = {}

    def keep(layer, gates, idx, weights):  # the FwPKM observer hook: this read's lookups, row 0
        picks[layer.name] = (idx[0], weights[0])

    layers = model.fwpkm_layers()
    kept = [layer.observer for layer in layers]
    for layer in layers:
        layer.observer = keep
    try:
        with torch.no_grad(), autocast, patched(model, episode, patch):
            logits = model(full)
    finally:
        for layer, observer in zip(layers, kept):
            layer.observer = observer
    return _answer_hits(logits, episode), {name: addresses(idx, w, episode) for name, (idx, w) in picks.items()}


@contextlib.contextmanager
def patched(model, episode, on: bool = True):
    """Address patching, the causal test of the address: within it (if `on`), every FwPKM layer
    reads the question's answer positions (its last token, which predicts the number's first token,
    then the number's own tokens but the last) with the queries of the asked needle's same tokens
    (its " is" and number), which wrote the number's tokens under their own lookups (look-ahead).
    If the memory holds the number and only the address is wrong, retrieval rises."""
    import torch

    if not on:
        yield
        return
    k = len(episode.answer)
    src = torch.arange(k) + episode.answer_starts[episode.asked] - 1
    dst = torch.arange(k) + len(episode.haystack) + len(episode.question) - 1
    layers = model.fwpkm_layers()
    for layer in layers:
        layer.query_patch = lambda q: q.index_copy(1, dst, q.index_select(1, src))
    try:
        yield
    finally:
        for layer in layers:
            layer.query_patch = None


def _answer_hits(logits, episode) -> list[bool]:
    """Per answer token, whether it is the top-1 prediction (teacher forced); exact match is all
    of them. A number is several tokens (" 16" "7" "7"), so exact match is about the product of
    the per-token rates: the per-token rates say how far a model is from it."""
    k = len(episode.answer)
    pred = logits[0, -k:].argmax(-1).tolist()  # the last question token predicts answer[0], ...
    return [p == a for p, a in zip(pred, episode.answer)]


def split_tokens(split) -> Any:
    """A split's packed tokens as one 1-D array, padding dropped."""
    keep = split.segments.doc_index[:, :-1] >= 0
    return split.segments.tokens[:, :-1][keep].numpy()


def finetune(model, exp, rule, source, tokenizer, seed: int, precision: str) -> float:
    """Train the slow weights on needle episodes (module doc); returns the last training loss."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from cl_platform.constants import IGNORE_INDEX
    from cl_platform.lm_module import LMModule, OptimSettings
    from cl_platform.device import Placement
    from cl_platform.trainer import make_trainer, quiet_lightning
    from streams.needles import make_episode

    quiet_lightning()
    cfg = exp.needle_config
    rng = np.random.default_rng(10_000 + seed)
    H = cfg.haystack_tokens
    n = exp.finetune_steps * exp.finetune_batch_size
    episodes = []
    for _ in range(n):
        depths = sorted(rng.uniform(0, 1, size=cfg.needles))
        episodes.append(make_episode(cfg, tokenizer, source, rng, depths=depths))
    width = 2 * H + max(len(e.question) + len(e.answer) for e in episodes)
    rows = []
    for e in episodes:
        seq = e.haystack + e.haystack + e.question + e.answer
        ids = torch.full((width + 1,), tokenizer.eot_id, dtype=torch.long)  # padding after the answer: no target
        ids[:len(seq)] = torch.tensor(seq)
        targets = torch.full((width,), IGNORE_INDEX, dtype=torch.long)
        a0 = 2 * H + len(e.question)
        targets[a0 - 1:a0 - 1 + len(e.answer)] = torch.tensor(e.answer)
        rows.append({"input_ids": ids[:-1], "targets": targets})
    model.set_write_rules(dataclasses.replace(rule, chunk=H, persistence="persist"))
    base_memory = model.snapshot_memory()
    # Each forward reads one episode (sequences_per_forward=1) from the base's memory: no episode
    # reads another's writes, as in evaluation.
    hook = model.register_forward_pre_hook(lambda *_: model.restore_memory(base_memory))
    torch.manual_seed(seed)
    module = LMModule(model, phase="pretrain", seed=seed, precision=precision, sequences_per_forward=1,
                      optim=OptimSettings(lr=exp.finetune_lr, weight_decay=0.0, grad_clip=1.0,
                                          warmup_steps=exp.finetune_steps // 10, decay_steps=exp.finetune_steps))
    try:
        make_trainer(Placement(), [], logger=False, progress_bar=False).fit(
            module, DataLoader(rows, batch_size=exp.finetune_batch_size, shuffle=False))
    finally:
        hook.remove()
        model.restore_memory(base_memory)
    return float(module.last_losses["lm"])


def haystack(exp, setup):
    """The tokens the scored episodes' haystacks come from, as the model reads text (documents
    joined by <eot>): the haystack domain's `exp.split`, or `exp.haystack_source` (any file, glob
    or corpus, loaded as a stream domain's source is) tokenized with the variant's tokenizer, its
    first half for `split: dev` and its second for `eval`. Raises StreamDataError naming the file."""
    import numpy as np

    from streams.sources import DomainConfig, load_documents

    if exp.haystack_source is None:
        return split_tokens(setup.scenario.domains[exp.haystack_domain].splits[exp.split])
    tokenizer = setup.scenario.tokenizer
    documents = load_documents(DomainConfig(name="haystack", source=exp.haystack_source),
                               setup.scenario.config.resolved_cache_dir())
    ids = [t for text in documents["text"] for t in tokenizer.encode(text) + [tokenizer.eot_id]]
    half = len(ids) // 2
    return np.asarray(ids[:half] if exp.split == "dev" else ids[half:], dtype=np.int64)


def episodes(exp, source, tokenizer):
    """The scored episodes: the same for every model and seed (paired comparisons), each needle
    asked equally often."""
    import numpy as np

    from streams.needles import make_episode

    rng = np.random.default_rng(12345)
    for i in range(exp.episodes):
        yield make_episode(exp.needle_config, tokenizer, source, rng, asked=i % exp.needle_config.needles)


def episode_facts(exp, setup) -> tuple[list[int], str, Any]:
    """For a variant's scored episodes: per episode, how many needles have the asked one's
    attribute (Episode.attribute_count; recomputed, so members scored earlier get it too), a
    hash of their tokens, which two models must share to be compared episode by episode, and the
    haystack tokens they come from (`haystack`: read and tokenized once, for every member)."""
    import hashlib

    digest = hashlib.sha1()
    counts = []
    source = haystack(exp, setup)
    for e in episodes(exp, source, setup.scenario.tokenizer):
        counts.append(e.attribute_count())
        digest.update(repr((e.haystack, e.question, e.answer)).encode())
    return counts, digest.hexdigest(), source


def read_episodes(model, exp, rule, source, tokenizer, precision: str,
                  writes: Sequence[int] | None = None, seed: int = 0, patch: bool = False) -> dict[str, Any]:
    """Exact match per setting (n-iter for each n, and in-pass), overall and by asked needle;
    `writes`: the FwPKM layers that write (default every one). `exp.memory` "reset": every
    episode starts from the model's memory as trained; "persist": each reading's memory carries
    over from the episode read before it (what that reading wrote), the episodes read in an order
    drawn from `seed`, as the official evaluation keeps its fast weights between samples.
    Results are in episode order either way."""
    import numpy as np
    import torch

    model.eval()
    memory = model.snapshot_memory()
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    cfg = exp.needle_config
    # Per reading, per episode: which answer tokens were the top-1 (exact match: all of them).
    tokens: dict[str, list[list[int]]] = {f"{n}-iter": [] for n in exp.iterations}
    tokens["in-pass"] = []
    ranks: dict[str, list[int]] = {f"{n}-iter": [] for n in exp.iterations}
    asked, distances = [], []
    address: dict[str, dict[str, list]] = {}  # per FwPKM layer, per episode: `addresses`
    scored = list(episodes(exp, source, tokenizer))
    order = (np.random.default_rng(seed).permutation(len(scored)).tolist() if exp.memory == "persist"
             else range(len(scored)))
    start = {s: memory for s in tokens}  # each reading's memory before the next episode
    done: dict[int, tuple] = {}
    for i in order:
        e = scored[i]
        answers, ranked = {}, {}
        for n in exp.iterations:
            answers[f"{n}-iter"], ranked[f"{n}-iter"] = read_iteratively(model, e, n, rule, start[f"{n}-iter"],
                                                                         autocast, writes, patch)
            if exp.memory == "persist":
                start[f"{n}-iter"] = model.snapshot_memory()
        answers["in-pass"], where = read_in_pass(model, e, rule, start["in-pass"], autocast, writes, patch)
        if exp.memory == "persist":
            start["in-pass"] = model.snapshot_memory()
        done[i] = (answers, ranked, where)
    for i, e in enumerate(scored):
        answers, ranked, where = done[i]
        asked.append(e.asked)
        distances.append(e.distance())
        for s, answer in answers.items():
            tokens[s].append([int(a) for a in answer])
        for s, rank in ranked.items():
            ranks[s].append(rank)
        for name, value in where.items():
            for key, x in value.items():
                address.setdefault(name, {}).setdefault(key, []).append(x)
    model.restore_memory(memory)
    hits = {k: [int(all(t)) for t in v] for k, v in tokens.items()}
    by_needle = {k: [statistics.fmean([h for h, a in zip(v, asked) if a == j]) for j in range(cfg.needles)]
                 for k, v in hits.items()}
    # Candidate match: the asked needle's number is the likeliest of the episode's numbers
    # (chance 1 / needles; issue 22), for the n-iter readings, whose final read writes nothing.
    return {"accuracy": {k: statistics.fmean(v) for k, v in hits.items()}, "hits": hits, "token_hits": tokens,
            "ranks": ranks, "candidate_match": {k: statistics.fmean(r == 1 for r in v) for k, v in ranks.items()},
            "by_needle": by_needle, "address": address,
            "distance_by_needle": [statistics.fmean([d for d, a in zip(distances, asked) if a == j])
                                   for j in range(cfg.needles)]}


def name_guess(counts: list[int]) -> float | None:
    """Exact match, on the episodes whose asked attribute is shared, of a model that recalls every
    value the episode's needles give that attribute and picks one at random: the mean of 1/k over
    them (k needles with the attribute). It needs no name, so only a rate above it shows retrieval
    by the name or ID (word needles: a memory keyed by "lucky stone is" reaches it; stop 48 in
    experiments/LOG.md)."""
    return mean_of([1 / k for k in counts if k > 1])


def by_flag(hits: list[list[int]], flags: list[bool], value: bool) -> dict[str, Any]:
    """Exact match over the episodes whose flag is `value`, pooled over the runs (None without any)."""
    return {"mean": mean_of([h for run in hits for h, f in zip(run, flags) if f == value]),
            "episodes": sum(f == value for f in flags)}


def token_accuracy(hits: list[list[int]]) -> list[float]:
    """Top-1 rate of the answer's i-th token over the episodes whose answer has an i-th token."""
    width = max(map(len, hits))
    return [statistics.fmean(h[i] for h in hits if len(h) > i) for i in range(width)]
