"""Retrain the shipped tokenizer on a fixed sample of the shipped corpora, or train one for a
stream's pretraining domains.

    clp tokenizer build [--out PATH] [--vocab-size 4096]
    clp tokenizer build --stream experiments/configs/streams/reference.yaml --out streams/assets/tokenizer_general.json

Sample (deterministic): for each domain, its documents (after the domain's filters) are permuted
exactly as the stream splitter permutes them (`streams.splits.domain_permutation` with the
stream's seed and the domain's name), and documents are taken from the *end* of that permutation
until the domain's characters are collected. The stream fills `eval`, `adapt`, `pretrain` and
`dev` from the *front* of the same permutation, so while a domain's splits use less than what is
left by the sample, no held-out or streamed document is seen by the tokenizer
(tests/streams/test_default_stream.py checks this for the default stream; `--stream` checks it for
the given one before training and refuses an overlap).

- Default (the shipped tokenizer): the four stream domains of the shipped corpora (code, law,
  math, web), 1,500,000 characters each, seed 0.
- `--stream YAML`: the stream's domains that have pretraining tokens, `STREAM_CHARS` characters
  shared in proportion to their pretraining budgets. The reference bases' tokenizer is made this
  way from the reference stream: every token it has was seen by the base in pretraining, and the
  streamed domains are new text in a general vocabulary, as they are for any pretrained LM (a
  tokenizer that had seen them would give them tokens the base has only been pushed away from
  as outputs: a confound).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from cl_platform.check import ConfigError
from cl_platform.atomic import atomic_write
from streams.tokenizer import SHIPPED_PATH, load_tokenizer, train_tokenizer

CHARS_PER_DOMAIN = 1_500_000
STREAM_CHARS = 12_000_000  # --stream: the default's total of 6 M, doubled (books are long)
DEFAULT_CORPORA = ["code", "law", "math", "web"]  # the stream domains (sorted), not every built corpus
SAMPLE_SEED = 0  # must equal StreamConfig.seed of the default stream (see module docstring)


def training_sample(chars_per_domain: int = CHARS_PER_DOMAIN, cache_dir: Path | None = None) -> dict[str, list[int]]:
    """Row numbers (into each shipped domain's loaded documents) of the tokenizer's training text."""
    texts_by_domain = _sample(chars_per_domain, cache_dir)
    return {name: rows for name, (rows, _) in texts_by_domain.items()}


def _sample(chars_per_domain: int, cache_dir: Path | None) -> dict[str, tuple[list[int], list[str]]]:
    from streams.sources import DomainConfig

    domains = [DomainConfig(name=name, source=f"corpus:{name}") for name in DEFAULT_CORPORA]
    texts = _load_texts(domains, cache_dir)
    return {d.name: sample_texts(texts[d.name], chars_per_domain, SAMPLE_SEED, d.name) for d in domains}


def _load_texts(domains: list, cache_dir: Path | None) -> dict[str, list[str]]:
    from streams.sources import load_documents

    with tempfile.TemporaryDirectory(prefix="clp-tokenizer-") as tmp:
        cache = Path(cache_dir) if cache_dir is not None else Path(tmp)
        return {d.name: list(load_documents(d, cache)["text"]) for d in domains}


def sample_texts(texts: list[str], chars: int, seed: int, name: str) -> tuple[list[int], list[str]]:
    """Row numbers and texts taken from the end of the domain's split permutation until `chars`
    characters are collected."""
    from streams.splits import domain_permutation

    rows, chosen, total = [], [], 0
    for row in domain_permutation(len(texts), seed, name)[::-1]:
        if total >= chars:
            break
        rows.append(int(row))
        chosen.append(texts[int(row)])
        total += len(texts[int(row)])
    return rows, chosen


def _pretraining_texts(stream: str):
    """The stream's config and the texts of its domains that have pretraining tokens."""
    from streams.stream import load_stream_config

    cfg = load_stream_config(stream)
    domains = [d for d in cfg.domains if cfg.budget(d.name).pretrain > 0]
    if not domains:
        raise ConfigError(f"--stream {stream}: no domain has pretraining tokens to train a tokenizer on", field="stream")
    return cfg, _load_texts(domains, Path(cfg.cache_dir) if cfg.cache_dir else None)


def _sample_of(cfg, texts: dict[str, list[str]]) -> dict[str, tuple[list[int], list[str]]]:
    total = sum(cfg.budget(name).pretrain for name in texts)
    return {name: sample_texts(t, STREAM_CHARS * cfg.budget(name).pretrain // total, cfg.seed, name)
            for name, t in texts.items()}


def stream_sample(stream: str) -> dict[str, tuple[list[int], list[str]]]:
    """The `--stream` sample: the stream's pretraining domains, STREAM_CHARS shared by budget."""
    return _sample_of(*_pretraining_texts(stream))


def check_held_out(stream: str, cfg, tok, texts: dict[str, list[str]], sample_rows: dict[str, list[int]]) -> None:
    """Refuse a sample that holds a document of a domain's eval, dev or adapt split, as the stream
    splits it with this very tokenizer (its token counts decide where each split ends)."""
    import numpy as np

    from streams.splits import plan_splits

    for name, rows in sample_rows.items():
        counts = np.array([len(ids) for ids in tok.encode_batch(texts[name])], dtype=np.int64)
        occurrences = max(1, cfg.experience_domains.count(name))
        plan = plan_splits(counts, cfg.budget(name), occurrences, cfg.seed, name)
        held = {int(r) for part, idx in plan.all_parts().items() if part != "pretrain" for r in idx}
        seen = sorted(held & set(rows))
        if seen:
            raise ConfigError(f"--stream {stream}: the tokenizer's sample of domain {name!r} holds {len(seen)} "
                              f"document(s) of its held-out or streamed splits (rows {seen[:5]}); lower "
                              f"STREAM_CHARS or the domain's budgets", field="stream")


def main(out: str | None = None, vocab_size: int = 4096, stream: str | None = None) -> int:
    if stream is not None and out is None:
        raise ConfigError("--stream: give --out too (the default --out is the shipped tokenizer of the four domains)",
                          field="out")
    target = Path(out) if out is not None else SHIPPED_PATH
    if not target.parent.is_dir():  # found before the minutes of training, not after
        raise ConfigError(f"--out {target}: its folder {target.parent} does not exist", field="out")
    if target.is_dir():
        raise ConfigError(f"--out {target} is a folder; name the tokenizer file (e.g. {target / 'tokenizer.json'})", field="out")
    t0 = time.perf_counter()
    if stream is None:
        sample = _sample(CHARS_PER_DOMAIN, cache_dir=None)
        texts = [t for _, chosen in sample.values() for t in chosen]
        tok = train_tokenizer(texts, vocab_size=vocab_size, out_path=target)
    else:
        cfg, domain_texts = _pretraining_texts(stream)  # loaded once: sampled, then split with the new tokenizer
        sample = _sample_of(cfg, domain_texts)
        texts = [t for _, chosen in sample.values() for t in chosen]
        tok = train_tokenizer(texts, vocab_size=vocab_size)
        check_held_out(stream, cfg, tok, domain_texts, {name: rows for name, (rows, _) in sample.items()})
        atomic_write(target, lambda f: f.write(tok.raw_json), binary=True)
        tok = load_tokenizer(target)
    chars = sum(len(t) for t in texts)
    print(
        f"trained on {len(texts):,} documents, {chars / 1e6:.2f} M chars "
        f"({', '.join(f'{n}: {len(r)}' for n, (r, _) in sample.items())}) in {time.perf_counter() - t0:.1f} s"
    )
    print(f"wrote {target}  vocab_size={tok.vocab_size}  fingerprint={tok.fingerprint[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
