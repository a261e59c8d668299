"""Needle in a haystack with n-iter reading (issue 8; the FwPKM paper's protocol) on the baseline
family's language-model bases, zero-shot and after a brief fine-tune on needle episodes.

    clp niah experiments/configs/niah.yaml                # the bases come from the family config (clp eval)
    clp niah experiments/configs/niah.yaml --seeds 0,1,2  # fine-tuning seeds
    clp niah experiments/configs/niah.yaml --models fwpkm,fwpkm-no-lookahead   # a subset (results are shared)
    clp niah experiments/configs/niah.yaml --base-seeds 0,1,2   # every base seed, t-intervals over the bases
    clp niah experiments/configs/niah.yaml reference=fwpkm      # every other model minus this one, paired

An episode (`streams/needles.py`): a window of real text with 5 needles "The secret number for
ID-xxxx is dddddd.", then a question about one; exact match of the number's tokens (teacher
forced: every answer token is the argmax given the gold tokens before it, which is exactly when
greedy decoding reproduces the number).

n-iter reading, per episode, from the model's own memory as trained (restored before every
episode, so no episode reads another's writes):
  1. n − 1 extra reads of the haystack, each read ending with one write over the whole context
     (the write rule's chunk set to the haystack's length);
  2. the final read of haystack + question with writes off, where the answer is scored.
So n-iter is n reads and n − 1 writes, asserted on every FwPKM layer's counters (`FwPKM.calls`,
`FwPKM.writes`). The column "in-pass" is the memory's ordinary reading mode instead: one read of
haystack + question writing every `chunk` tokens as it goes (the pretraining write rule).

Fine-tuning (`finetune: true`): the base's slow weights trained on needle episodes drawn from the
haystack domain's `pretrain` split, each laid out as `haystack haystack question answer` in one
sequence with writes every haystack-length tokens, so the question reads a memory written from two
reads of the haystack (as in 3-iter) and the gradient reaches the write path through the writes
(a write in an earlier forward is detached, so training on separate reads could not teach the
writing). Loss on the answer tokens only. Evaluation episodes come from the `eval` split.
Every training episode has a memory of its own, as every evaluation episode does: one sequence
per forward (`LMModule(sequences_per_forward=1)`), each forward starting from the base's memory,
which is also what evaluation starts from. (Before 2026-12-06 the fine-tune read its batch in
one forward into one memory that persisted from episode to episode, so a question read writes of
other episodes and of the other sequence in its batch — the collisions that kept recall at chance
(`experiments/LOG.md`, stop 43); results made so are recomputed, `FINETUNE_MEMORY`.)
Results: `<runs_root>/niah-<key>/`, one JSON per (model, seed), reused by later runs.

Addresses (in-pass, every FwPKM layer; `addresses`): whether the question reads where the asked
needle wrote. With look-ahead the token before a needle's number writes the number under its
lookup, and the question's last token reads under its own; their shared weight against the
asked needle's, the other needles' and two needles' writes with each other says whether a failed
read is the address (the query does not tell the needles apart) or what the slots hold.

A model may also change how far its variant's attention reaches (`model: {window: 4096}`; only
REACH_FIELDS, which hold no parameters, so the variant's base loads as it is). That is the
positive control a memory's null needs: the same base, the same fine-tuning and episodes, with
attention over the whole episode; if it retrieves and the memory does not, the pipeline is not
what fails.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from cl_platform.check import ConfigError, check, is_int, is_number
from experiments.studies.family import Family, load_family
from experiments.config_files import relative_to
from experiments.studies.study import cached, load_study, study_folder, write_results

MODEL_KEYS = ("variant", "finetune", "rule", "model", "writes")
# `writes: [3]`: only these FwPKM layers (block indices) write while a zero-shot model reads the
# episodes (default: every one); the others read what they hold. A per-layer ablation: which
# layer's memory carries the reading.
# What a model may change of its variant's architecture: how far attention reaches, nothing with
# parameters, so the variant's base loads as it is. `model: {window: 4096}` on the FwPKM base is the
# positive control (issue 22): the same weights with attention over the whole episode, fine-tuned on
# the same needles, which must retrieve for a memory's null result to mean the memory.
REACH_FIELDS = ("mixer", "window", "pswa_prob")
# How a fine-tuned model's training episodes hold memory (module doc); a fine-tuned result made
# otherwise is not reused.
FINETUNE_MEMORY = "per-episode"


@dataclass
class NeedleExperiment:
    family: str = "longctx.yaml"  # the baseline family config (experiments/studies/longctx.py), relative to this file
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {variant, finetune, rule}
    needles: dict[str, Any] = field(default_factory=dict)  # streams.needles.NeedleConfig fields
    haystack_domain: str = "web"
    iterations: list[int] = field(default_factory=lambda: [1, 2, 3])
    episodes: int = 100  # evaluation episodes, the asked needle cycling through every depth
    finetune_steps: int = 300
    finetune_batch_size: int = 2
    finetune_lr: float = 1e-3
    base_seed: int = 0  # which of the family's bases
    seeds: list[int] = field(default_factory=lambda: [0])  # fine-tuning seeds (zero-shot models: the first only)
    # A model the others are compared with, episode by episode (`reference=NAME` on the command
    # line): every reading's exact-match difference with a paired bootstrap over the episodes (and,
    # over base seeds, the t-interval of the bases' differences). Printing only: not in the key.
    reference: str | None = None
    runs_root: str | None = None

    def __post_init__(self) -> None:
        from cl_platform.memory.fwpkm import WriteRule
        from streams.needles import NeedleConfig

        try:
            self.needle_config = NeedleConfig(**self.needles)
        except TypeError as err:
            raise ConfigError(f"needle config field 'needles': {err}") from None
        check(isinstance(self.models, dict) and bool(self.models), self, "models",
              "must map model names to {variant, finetune, rule}")
        for name, spec in self.models.items():
            bad = [k for k in (spec or {}) if k not in MODEL_KEYS]
            check(isinstance(spec, dict) and not bad and "variant" in spec, self, "models",
                  f"model {name!r}: needs 'variant' and may set only {list(MODEL_KEYS)} (got {bad or spec!r})")
            check(isinstance(spec.get("finetune", False), bool), self, "models", f"model {name!r}: finetune must be true or false")
            reach = spec.get("model") or {}
            check(isinstance(reach, dict) and set(reach) <= set(REACH_FIELDS), self, "models",
                  f"model {name!r}: 'model' may change only {list(REACH_FIELDS)} of the variant's architecture "
                  f"(got {reach!r})")
            writes = spec.get("writes")
            check(writes is None or (isinstance(writes, list) and all(is_int(i) for i in writes)
                                     and len(set(writes)) == len(writes)), self, "models",
                  f"model {name!r}: writes must be a list of distinct FwPKM layer indices (got {writes!r})")
            check(writes is None or not spec.get("finetune"), self, "models",
                  f"model {name!r}: writes applies to zero-shot models (finetune: false)")
            try:
                WriteRule(**(spec.get("rule") or {}))
            except (TypeError, ConfigError) as err:
                raise ConfigError(f"needle config field 'models.{name}.rule': {err}") from None
        check(bool(self.iterations) and all(is_int(n, 1) for n in self.iterations), self, "iterations",
              "must be a list of ints >= 1 (reads of the haystack)")
        for name in ("episodes", "finetune_steps", "finetune_batch_size"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(is_number(self.finetune_lr, 0, strict=True), self, "finetune_lr", "must be a number > 0")
        check(bool(self.seeds) and all(is_int(s) for s in self.seeds) and len(set(self.seeds)) == len(self.seeds),
              self, "seeds", "must be a non-empty list of distinct ints")
        check(self.reference is None or self.reference in self.models, self, "reference",
              f"{self.reference!r} is not among the models ({list(self.models)}; with --models, name it there too)")


def load(path: str | Path, seeds: list[int] | None = None, models: list[str] | None = None,
         overrides: Sequence[str] = ()) -> NeedleExperiment:
    """The experiment in a YAML file with `key=value` overrides; `seeds` replaces the file's;
    `models` keeps only those."""
    exp = load_study(NeedleExperiment, path, "needle config", overrides, seeds, subset=("models", models, "--models"))
    exp.family = relative_to(path, exp.family)
    return exp


# --- the protocol ------------------------------------------------------------------------------------
def read_iteratively(model, episode, n: int, rule, memory, autocast, writes: Sequence[int] | None = None
                     ) -> tuple[list[bool], int]:
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


def read_in_pass(model, episode, rule, memory, autocast, writes: Sequence[int] | None = None
                 ) -> tuple[list[bool], dict[str, dict[str, Any]]]:
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
        with torch.no_grad(), autocast:
            logits = model(full)
    finally:
        for layer, observer in zip(layers, kept):
            layer.observer = observer
    return _answer_hits(logits, episode), {name: addresses(idx, w, episode) for name, (idx, w) in picks.items()}


def shared_weight(idx, weights, a: int, b: int) -> float:
    """How much two positions' lookups agree: per head, the read weight they put on the same slots
    (Σ over slots of min(w_a, w_b); each head's top-k weights sum to 1), averaged over the heads.
    1 when both pick the same slots with the same weights, 0 when they share none."""
    total = 0.0
    for h in range(idx.shape[1]):
        wb = dict(zip(idx[b, h].tolist(), weights[b, h].tolist()))
        total += sum(min(x, wb[s]) for s, x in zip(idx[a, h].tolist(), weights[a, h].tolist()) if s in wb)
    return total / idx.shape[1]


def addresses(idx, weights, episode) -> dict[str, Any]:
    """Where the question reads against where each needle wrote, in one in-pass read (idx, weights:
    (T, H, k) of one FwPKM layer). With look-ahead the token before a needle's number ("is") writes
    the number's value under its own lookup, and the question's last token ("is") reads under its
    own: `asked` and `others` are the shared weight (`shared_weight`) of the question's lookup with
    the asked needle's write and, averaged, with the other needles'; `match` is 1 when the asked
    needle's is the largest (shared among ties, so chance is 1 / needles); `between` is the mean
    shared weight of two needles' writes with each other — what the template alone makes them share.
    A memory keyed by the ID has match near 1 and `between` low; one keyed by the template has
    asked ≈ others ≈ between."""
    query = len(episode.haystack) + len(episode.question) - 1
    writes = [start - 1 for start in episode.answer_starts]
    shared = [shared_weight(idx, weights, query, p) for p in writes]
    asked = shared[episode.asked]
    others = [x for j, x in enumerate(shared) if j != episode.asked]
    top = max(shared)
    pairs = [shared_weight(idx, weights, a, b) for i, a in enumerate(writes) for b in writes[i + 1:]]
    return {"asked": asked, "others": statistics.fmean(others) if others else None,
            "match": (asked == top) / sum(x == top for x in shared),
            "between": statistics.fmean(pairs) if pairs else None}


def _answer_hits(logits, episode) -> list[bool]:
    """Per answer token, whether it is the top-1 prediction (teacher forced); exact match is all
    of them. A number is several tokens (" 16" "7" "7"), so exact match is about the product of
    the per-token rates: the per-token rates say how far a model is from it."""
    k = len(episode.answer)
    pred = logits[0, -k:].argmax(-1).tolist()  # the last question token predicts answer[0], ...
    return [p == a for p, a in zip(pred, episode.answer)]


# --- one model ------------------------------------------------------------------------------------------
def _tokens(split) -> Any:
    """A split's packed tokens as one 1-D array, padding dropped."""
    keep = split.segments.doc_index[:, :-1] >= 0
    return split.segments.tokens[:, :-1][keep].numpy()


def finetune(model, exp: NeedleExperiment, rule, source, tokenizer, seed: int, precision: str) -> float:
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


def episodes(exp: NeedleExperiment, source, tokenizer):
    """The scored episodes: the same for every model and seed (paired comparisons), each needle
    asked equally often."""
    import numpy as np

    from streams.needles import make_episode

    rng = np.random.default_rng(12345)
    for i in range(exp.episodes):
        yield make_episode(exp.needle_config, tokenizer, source, rng, asked=i % exp.needle_config.needles)


def episode_facts(exp: NeedleExperiment, setup) -> tuple[list[int], str]:
    """For a variant's scored episodes: per episode, how many needles have the asked one's
    attribute (Episode.attribute_count; recomputed, so members scored earlier get it too), and a
    hash of their tokens, which two models must share to be compared episode by episode."""
    import hashlib

    data = setup.scenario.domains[exp.haystack_domain]
    digest = hashlib.sha1()
    counts = []
    for e in episodes(exp, _tokens(data.splits["eval"]), setup.scenario.tokenizer):
        counts.append(e.attribute_count())
        digest.update(repr((e.haystack, e.question, e.answer)).encode())
    return counts, digest.hexdigest()


def score(model, exp: NeedleExperiment, rule, source, tokenizer, precision: str,
          writes: Sequence[int] | None = None) -> dict[str, Any]:
    """Exact match per setting (n-iter for each n, and in-pass), overall and by asked needle;
    `writes`: the FwPKM layers that write (default every one)."""
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
    for e in episodes(exp, source, tokenizer):
        asked.append(e.asked)
        distances.append(e.distance())
        for n in exp.iterations:
            answer, rank = read_iteratively(model, e, n, rule, memory, autocast, writes)
            tokens[f"{n}-iter"].append([int(a) for a in answer])
            ranks[f"{n}-iter"].append(rank)
        answer, where = read_in_pass(model, e, rule, memory, autocast, writes)
        tokens["in-pass"].append([int(a) for a in answer])
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


def needle_family(exp: NeedleExperiment) -> Family:
    """The baseline family the models come from, with this study's runs_root if it sets one."""
    family = load_family(exp.family)
    if exp.runs_root is not None:
        family.runs_root = exp.runs_root
    return family


def check_models(exp: NeedleExperiment) -> dict[str, Any]:
    """Each model's variant setup, every name checked against the family and its stream; raises
    before any pretraining, fine-tuning or scoring."""
    family = needle_family(exp)
    setups = {}
    for name, spec in exp.models.items():
        if spec["variant"] not in family.variants:
            raise ConfigError(f"needle config field 'models.{name}.variant': {spec['variant']!r} is not a variant of "
                              f"{exp.family} ({list(family.variants)})")
        if spec["variant"] not in setups:
            setups[spec["variant"]] = family.setup(spec["variant"], exp.base_seed, who="needle")
        layers = setups[spec["variant"]].model_config.fwpkm_layers
        if not set(spec.get("writes") or []) <= set(layers):
            raise ConfigError(f"needle config field 'models.{name}.writes': {spec['writes']} are not all FwPKM layers of "
                              f"variant {spec['variant']!r} ({list(layers)})")
        try:
            reach_config(setups[spec["variant"]].model_config, spec)
        except ConfigError as err:
            raise ConfigError(f"needle config field 'models.{name}.model': {err}") from None
    scenario = next(iter(setups.values())).scenario
    if exp.haystack_domain not in scenario.domains:
        raise ConfigError(f"needle config field 'haystack_domain': {exp.haystack_domain!r} is not a domain of "
                          f"the family's stream ({list(scenario.domains)})")
    return setups


def reach_config(model_config, spec: dict[str, Any]):
    """The variant's architecture with the model's attention-reach changes (`spec["model"]`)."""
    return dataclasses.replace(model_config, **(spec.get("model") or {}))


def evaluate(exp: NeedleExperiment, name: str, seed: int, say: Callable[[str], None] = print,
             setups: dict[str, Any] | None = None) -> dict[str, Any]:
    """One model scored (fine-tuned first if asked); `setups`: check_models(exp), if already made."""
    from experiments.base import ensure_base
    from experiments.setup import build_model

    spec = exp.models[name]
    setup = (setups or check_models(exp))[spec["variant"]]
    _, _, _, weights = ensure_base(setup, progress_bar=False, say=say)
    cfg = setup.config
    rule = dataclasses.replace(cfg.pretrain.fwpkm, **(spec.get("rule") or {}))
    model_config = reach_config(setup.model_config, spec)
    model = build_model(model_config, 0, rule)
    model.load_state_dict(weights)  # reach fields hold no parameters: the base loads unchanged
    tokenizer = setup.scenario.tokenizer
    data = setup.scenario.domains[exp.haystack_domain]
    loss = None
    if spec.get("finetune"):
        say(f"{name}, seed {seed}: fine-tuning {exp.finetune_steps} steps on needle episodes")
        loss = finetune(model, exp, rule, _tokens(data.splits["pretrain"]), tokenizer, seed, cfg.pretrain.precision)
    say(f"{name}, seed {seed}: scoring {exp.episodes} episodes")
    result = score(model, exp, rule, _tokens(data.splits["eval"]), tokenizer, cfg.pretrain.precision, spec.get("writes"))
    return {"model": name, "seed": seed, "spec": spec, "finetune_loss": loss,
            "finetune_memory": FINETUNE_MEMORY if spec.get("finetune") else None, "window": model_config.window,
            "mixer": model_config.mixer,
            "fwpkm_layers": setup.model_config.fwpkm_layers, **result}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion k / n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, mid - half), min(1.0, mid + half))


def member_key(family: Family, variant: str, setup) -> dict[str, Any]:
    """What a member's result depends on beyond its spec: its variant's definition in the family
    and the base it reads."""
    from experiments.setup import base_key

    return {"variant_config": family.variants[variant], "base_key": base_key(setup)}


def study_identity(exp: NeedleExperiment, family: Family) -> dict[str, Any]:
    """What a result folder is keyed by: the experiment's settings (not its model list, seeds or
    runs root: members are cached one per file) and the family's base run config, not its file's
    text. Not the family's variants: each member records its variant's definition and base key
    and is reused only for the same ones, so a variant added to the family leaves the others'
    results where they are (as `clp eval` and `clp repeat` key their folders)."""
    identity = {k: v for k, v in dataclasses.asdict(exp).items()
                if k not in ("models", "seeds", "runs_root", "family", "reference")}
    if identity["needles"].get("form") == "name_first":  # the default, said or not, keys the folder as before the field
        del identity["needles"]["form"]
    identity["family"] = family.identity()["base"]
    return identity


def run(exp: NeedleExperiment, say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    family = needle_family(exp)
    folder = study_folder(family.resolved_runs_root(), "niah", study_identity(exp, family))
    setups = check_models(exp)  # every name checked, the stream loaded once
    keys = {variant: member_key(family, variant, setup) for variant, setup in setups.items()}
    facts = {variant: episode_facts(exp, setup) for variant, setup in setups.items()}
    if exp.reference is not None:
        ref = exp.models[exp.reference]["variant"]
        other = [name for name, spec in exp.models.items() if facts[spec["variant"]][1] != facts[ref][1]]
        check(not other, exp, "reference", f"models {other} read other episodes than {exp.reference!r} "
              f"(their variants' {exp.haystack_domain} eval split or tokenizer differ): no paired comparison")
    # A member is reused only for the same model spec (variant, fine-tuning, write rule), the same
    # variant definition and base, and, if fine-tuned, the same episode memory.
    results = [cached(folder, name, seed, lambda: {**evaluate(exp, name, seed, say, setups), **keys[spec["variant"]]},
                      fresh=lambda r: r.get("spec") == spec
                      and all(r.get(k) == v for k, v in keys[spec["variant"]].items())
                      and (not spec.get("finetune") or r.get("finetune_memory") == FINETUNE_MEMORY))
               for name, spec in exp.models.items() for seed in (exp.seeds if spec.get("finetune") else exp.seeds[:1])]
    summary = summarise(exp, results, {name: facts[spec["variant"]][0] for name, spec in exp.models.items()})
    text = table(exp, summary)
    write_results(folder, summary, text)
    say(text)
    say(f"results: {folder / 'results.json'}")
    return folder, summary


def summarise(exp: NeedleExperiment, results: list[dict], counts: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Per model: exact match per reading (mean over seeds, Wilson over every episode), by asked
    needle, candidate match, answer-token rates, and with `counts` (per model, per episode: how
    many needles have the asked one's attribute) exact match on the episodes where the attribute
    is unique and where it is shared, beside the shared episodes' guess rate (`name_guess`)."""
    out: dict[str, Any] = {"episodes": exp.episodes, "models": {}}
    for name in exp.models:
        runs = [r for r in results if r["model"] == name]
        settings = list(runs[0]["accuracy"])
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "finetuned": bool(exp.models[name].get("finetune"))}
        for s in settings:
            values = [r["accuracy"][s] for r in runs]
            k = sum(sum(r["hits"][s]) for r in runs)
            entry[s] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "wilson": wilson(k, exp.episodes * len(runs)),
                        "by_needle": [statistics.fmean(v) for v in zip(*(r["by_needle"][s] for r in runs))]}
        entry["distance_by_needle"] = runs[0]["distance_by_needle"]
        if all("ranks" in r for r in runs):  # members scored before candidate match have none
            entry["candidate_match"] = {}
            for s in runs[0]["ranks"]:
                k = sum(sum(rank == 1 for rank in r["ranks"][s]) for r in runs)
                entry["candidate_match"][s] = {"mean": k / (exp.episodes * len(runs)),
                                               "wilson": wilson(k, exp.episodes * len(runs))}
        if all("token_hits" in r for r in runs):  # members scored before it have none
            entry["token_accuracy"] = {s: token_accuracy([h for r in runs for h in r["token_hits"][s]])
                                       for s in runs[0]["token_hits"]}
        if all(r.get("address") for r in runs):  # members scored before it (or without an FwPKM) have none
            entry["address"] = {layer: {key: mean_of([x for r in runs for x in r["address"][layer][key]])
                                        for key in runs[0]["address"][layer]} for layer in runs[0]["address"]}
            # Does reading the asked needle's slots go with retrieving it? In-pass exact match on
            # the episodes whose address matched (the asked needle's shared weight the largest,
            # alone) and on those where another needle's was larger (ties left out).
            entry["exact_by_address"] = {layer: {kind: mean_of([h if m == value else None for r in runs
                                                                for h, m in zip(r["hits"]["in-pass"],
                                                                                r["address"][layer]["match"])])
                                                 for kind, value in (("matched", 1.0), ("missed", 0.0))}
                                         for layer in entry["address"]}
        if counts is not None:
            flags = [c > 1 for c in counts[name]]
            if "address" in entry:  # does the read find the asked needle where only the name or ID tells it apart?
                entry["address_match_by_attribute"] = {
                    layer: {kind: by_flag([r["address"][layer]["match"] for r in runs], flags, kind == "shared")["mean"]
                            for kind in ("unique", "shared")} for layer in entry["address"]}
            entry["by_attribute"] = {s: {kind: by_flag([r["hits"][s] for r in runs], flags, kind == "shared")
                                         for kind in ("unique", "shared")} for s in settings}
            entry["name_guess"] = name_guess(counts[name])
        if exp.reference not in (None, name):
            ref = [r for r in results if r["model"] == exp.reference]
            entry["paired"] = {s: paired_episodes([r["hits"][s] for r in ref], [r["hits"][s] for r in runs])
                               for s in settings}
        out["models"][name] = entry
    return out


def paired_episodes(reference: list[list[int]], other: list[list[int]], samples: int = 2000, seed: int = 0,
                    level: float = 0.95) -> dict[str, float]:
    """Exact match of `other` minus `reference` on the same episodes (each side's runs averaged per
    episode first), with a percentile interval over episodes drawn with replacement, the same draw
    for both sides: within one base, over its episodes only."""
    import numpy as np

    from analysis.positions import paired_difference

    a, b = np.asarray(reference, dtype=np.float64).mean(0), np.asarray(other, dtype=np.float64).mean(0)
    if a.shape != b.shape:
        raise ValueError(f"paired_episodes: {a.size} reference episodes against {b.size}")
    ones = np.ones((a.size, 1))  # each episode one "document" of one scored answer
    d = paired_difference(a[:, None], ones, b[:, None], ones, samples=samples, seed=seed, level=level)[0]
    return {k: d[k] for k in ("value", "low", "high")}


def mean_of(values: list[float | None]) -> float | None:
    """The mean of the values that exist (None: one needle has no others to compare with)."""
    kept = [x for x in values if x is not None]
    return statistics.fmean(kept) if kept else None


def name_guess(counts: list[int]) -> float | None:
    """Exact match, on the episodes whose asked attribute is shared, of a model that recalls every
    value the episode's needles give that attribute and picks one at random: the mean of 1/k over
    them (k needles with the attribute). It needs no name, so only a rate above it shows retrieval
    by the name or ID (word needles: a memory keyed by "lucky stone is" reaches it; stop 48 in
    experiments/LOG.md)."""
    shared = [1 / k for k in counts if k > 1]
    return statistics.fmean(shared) if shared else None


def by_flag(hits: list[list[int]], flags: list[bool], value: bool) -> dict[str, Any]:
    """Exact match over the episodes whose flag is `value`, pooled over the runs (None without any)."""
    picked = [h for run in hits for h, f in zip(run, flags) if f == value]
    return {"mean": statistics.fmean(picked) if picked else None, "episodes": sum(f == value for f in flags)}


def token_accuracy(hits: list[list[int]]) -> list[float]:
    """Top-1 rate of the answer's i-th token over the episodes whose answer has an i-th token."""
    width = max(map(len, hits))
    return [statistics.fmean(h[i] for h in hits if len(h) > i) for i in range(width)]


def split_match(entry: dict[str, Any], layer: str) -> str:
    """' (unique a / shared b)': address match where the asked attribute is unique or shared, if known."""
    split = entry.get("address_match_by_attribute", {}).get(layer)
    if split is None:
        return ""
    return " (unique " + " / shared ".join("n/a" if split[k] is None else f"{split[k]:.2f}"
                                           for k in ("unique", "shared")) + ")"


def exact_by_address(entry: dict[str, Any], layer: str) -> str:
    """', in-pass exact a where matched / b where not' (n/a: no such episode)."""
    split = entry.get("exact_by_address", {}).get(layer)
    if split is None:
        return ""
    cell = ["n/a" if split[k] is None else f"{split[k]:.2f}" for k in ("matched", "missed")]
    return f", in-pass exact {cell[0]} where matched / {cell[1]} where not"


def table(exp: NeedleExperiment, summary: dict) -> str:
    settings = [f"{n}-iter" for n in exp.iterations] + ["in-pass"]
    width = 24
    cfg = exp.needle_config
    lines = [f"needle in a haystack: exact match over {exp.episodes} episodes ({cfg.needles} {cfg.style} needles in "
             f"{cfg.haystack_tokens} tokens of {exp.haystack_domain}); mean ± std over seeds "
             f"[95 % Wilson interval over all episodes]",
             f"{'':>26s}" + "".join(f"{s:>{width}s}" for s in settings)]
    for name, entry in summary["models"].items():
        cells = [f"{entry[s]['mean']:.2f}" + (f" ± {entry[s]['std']:.2f}" if len(entry['seeds']) > 1 else "")
                 + f" [{entry[s]['wilson'][0]:.2f}, {entry[s]['wilson'][1]:.2f}]" for s in settings]
        label = f"{name} ({'fine-tuned' if entry['finetuned'] else 'zero-shot'})"
        lines.append(f"{label:>26s}" + "".join(f"{c:>{width}s}" for c in cells))
    lines.append(f"candidate match: the asked needle's number is the likeliest of the {exp.needle_config.needles} "
                 f"(chance {1 / exp.needle_config.needles:.2f}) [95 % Wilson interval]")
    for name, entry in summary["models"].items():
        match = entry.get("candidate_match")
        cells = [f"{match[s]['mean']:.2f} [{match[s]['wilson'][0]:.2f}, {match[s]['wilson'][1]:.2f}]"
                 if match and s in match else "n/a" for s in settings]
        lines.append(f"{name:>26s}" + "".join(f"{c:>{width}s}" for c in cells))
    if any("token_accuracy" in entry for entry in summary["models"].values()):
        lines.append("answer tokens: top-1 rate of the answer's 1st, 2nd, ... token (teacher forced; exact match "
                     "needs every one)")
        for name, entry in summary["models"].items():
            acc = entry.get("token_accuracy")
            lines.append(f"{name:>26s}  " + ("n/a (scored before token rates)" if acc is None else "   ".join(
                f"{s} " + " ".join(f"{a:.2f}" for a in acc[s]) for s in settings)))
    if exp.reference is not None:
        lines.append(f"paired against {exp.reference}: exact match difference, the same episodes [95 % paired "
                     f"bootstrap over the episodes, within this base]")
        for name, entry in summary["models"].items():
            if "paired" in entry:
                cells = [f"{entry['paired'][s]['value']:+.2f} [{entry['paired'][s]['low']:+.2f}, "
                         f"{entry['paired'][s]['high']:+.2f}]" for s in settings]
                lines.append(f"{name:>26s}" + "".join(f"{c:>{width}s}" for c in cells))
    if any("address" in entry for entry in summary["models"].values()):
        lines.append(f"addresses, in-pass, per FwPKM layer: the weight the question's read shares with the asked "
                     f"needle's write / with the other needles' (mean) / two needles' writes with each other; match: "
                     f"the asked needle's is the largest (chance {1 / cfg.needles:.2f})")
        for name, entry in summary["models"].items():
            where = entry.get("address")
            lines.append(f"{name:>26s}  " + ("n/a" if where is None else "   ".join(
                f"{layer} " + "/".join("—" if where[layer][k] is None else f"{where[layer][k]:.2f}"
                                       for k in ("asked", "others", "between"))
                + f" match {where[layer]['match']:.2f}" + split_match(entry, layer)
                + exact_by_address(entry, layer) for layer in where)))
    first = next(iter(summary["models"].values()))
    if "by_attribute" in first:
        counts = first["by_attribute"][settings[0]]
        guess = first.get("name_guess")
        lines.append(f"by the asked needle's attribute: unique among the needles ({counts['unique']['episodes']} "
                     f"episodes) / shared with another ({counts['shared']['episodes']}; only the name or ID tells them "
                     f"apart" + ("" if guess is None else f"; a pick among the episode's values of the asked attribute, "
                                 f"no name needed, is right {guess:.2f} there") + ")")
        for name, entry in summary["models"].items():
            cells = ["/".join("n/a" if c["mean"] is None else f"{c['mean']:.2f}"
                              for c in (entry["by_attribute"][s]["unique"], entry["by_attribute"][s]["shared"]))
                     for s in settings]
            lines.append(f"{name:>26s}  " + "   ".join(f"{s} {c}" for s, c in zip(settings, cells)))
    lines.append("by asked needle (mean tokens from needle to answer: "
                 + ", ".join(f"{d:.0f}" for d in first["distance_by_needle"]) + "):")
    for name, entry in summary["models"].items():
        lines.append(f"{name:>26s}  " + "   ".join(f"{s} " + " ".join(f"{a:.2f}" for a in entry[s]["by_needle"])
                                                for s in settings))
    return "\n".join(lines)


# --- over pretraining seeds -----------------------------------------------------------------------
def run_over_bases(exp: NeedleExperiment, base_seeds: list[int],
                   say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """`run` once per base seed (each in its own folder, its members reused), then every model's
    exact match and candidate match per base with the mean and the 95 % Student-t interval over
    the bases: the unit of a base-dependent effect (a Wilson interval over one base's episodes is
    within-base). Every base seed's models are checked before any is scored."""
    if not (isinstance(base_seeds, list) and base_seeds and all(is_int(s, 0) for s in base_seeds)
            and len(set(base_seeds)) == len(base_seeds)):
        raise ConfigError(f"--base-seeds must be distinct ints >= 0, got {base_seeds!r}")
    members = [dataclasses.replace(exp, base_seed=s) for s in base_seeds]
    for member in members:
        check_models(member)
    per_base = {}
    for member in members:
        say(f"--- base seed {member.base_seed}")
        per_base[member.base_seed] = run(member, say)[1]
    summary = over_bases(per_base, exp.reference)
    family = needle_family(exp)
    identity = {k: v for k, v in study_identity(exp, family).items() if k != "base_seed"}
    identity.update(base_seeds=base_seeds, models=sorted(exp.models))
    folder = study_folder(family.resolved_runs_root(), "niah-bases", identity)
    folder.mkdir(parents=True, exist_ok=True)
    text = bases_table(exp, summary)
    write_results(folder, summary, text)
    say(text)
    say(f"results: {folder / 'results.json'}")
    return folder, summary


def over_bases(per_base: dict[int, dict[str, Any]], reference: str | None = None) -> dict[str, Any]:
    """{"base_seeds", "models": {name: {"exact": {setting: mean_std}, "candidate": {...}}}} from
    each base's `summarise` output (a base's value: its mean over fine-tuning seeds); with a
    `reference` model, every other model's "paired": the bases' differences to it (mean_std)."""
    from analysis.aggregate import mean_std

    seeds = list(per_base)
    first = per_base[seeds[0]]["models"]
    out: dict[str, Any] = {"base_seeds": seeds, "models": {}}
    for name, entry in first.items():
        settings = [k for k in entry if k.endswith("-iter") or k == "in-pass"]
        row = {"exact": {s: mean_std([per_base[b]["models"][name][s]["mean"] for b in seeds]) for s in settings}}
        if all("candidate_match" in per_base[b]["models"][name] for b in seeds):
            row["candidate"] = {s: mean_std([per_base[b]["models"][name]["candidate_match"][s]["mean"] for b in seeds])
                                for s in entry["candidate_match"]}
        if reference is not None and name != reference:
            row["paired"] = {s: mean_std([per_base[b]["models"][name][s]["mean"]
                                          - per_base[b]["models"][reference][s]["mean"] for b in seeds])
                             for s in settings}
        out["models"][name] = row
    return out


def bases_table(exp: NeedleExperiment, summary: dict[str, Any]) -> str:
    settings = [f"{n}-iter" for n in exp.iterations] + ["in-pass"]
    seeds = summary["base_seeds"]

    def cell(stat: dict[str, Any] | None) -> str:
        if stat is None:
            return "n/a"
        values = " / ".join(f"{v:.2f}" for v in stat["values"])
        if len(stat["values"]) < 2:
            return values
        return f"{stat['mean']:.2f} [{stat['t95'][0]:.2f}, {stat['t95'][1]:.2f}] ({values})"

    lines = [f"needle in a haystack over base seeds {seeds}: mean [95 % t-interval over the bases] "
             f"(each base's value, in seed order); {exp.episodes} episodes a base"]
    blocks = [("exact", "exact match"), ("candidate", f"candidate match (chance {1 / exp.needle_config.needles:.2f})")]
    if exp.reference is not None:
        blocks.append(("paired", f"exact match − {exp.reference}"))
    for what, label in blocks:
        cells = {name: [cell((row.get(what) or {}).get(s)) for s in settings] for name, row in summary["models"].items()
                 if what in row}
        width = 2 + max(len(c) for c in [*settings, *(c for row in cells.values() for c in row)])
        lines.append(f"{label:>30s}" + "".join(f"{s:>{width}s}" for s in settings))
        lines += [f"{name:>30s}" + "".join(f"{c:>{width}s}" for c in row) for name, row in cells.items()]
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
         models: list[str] | None = None, base_seeds: list[int] | None = None) -> int:
    exp = load(config, seeds, models, overrides)
    if base_seeds is None:
        run(exp)
    else:
        run_over_bases(exp, base_seeds)
    return 0
