"""Retrain the shipped tokenizer on a fixed sample of the shipped corpora.

    clp tokenizer build [--out PATH] [--vocab-size 4096]

Sample (deterministic, balanced): for each shipped domain (math, law, code, web, sorted), the
domain's documents are permuted exactly as the stream splitter permutes them
(`streams.splits.domain_permutation` with the default seed 0 and the domain name), and
documents are taken from the *end* of that permutation until 1,500,000 characters are collected.
The stream fills `eval` and `adapt` from the *front* of the same permutation, so with the
default seed and budgets no held-out or streamed document is seen by the tokenizer
(tests/test_tokenizer.py checks this against experiments/configs/streams/default.yaml).
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from cl_platform.check import ConfigError
from streams.tokenizer import SHIPPED_PATH, train_tokenizer

CHARS_PER_DOMAIN = 1_500_000
SAMPLE_SEED = 0  # must equal StreamConfig.seed of the default stream (see module docstring)


def training_sample(chars_per_domain: int = CHARS_PER_DOMAIN, cache_dir: Path | None = None) -> dict[str, list[int]]:
    """Row numbers (into each shipped domain's loaded documents) of the tokenizer's training text."""
    texts_by_domain = _sample(chars_per_domain, cache_dir)
    return {name: rows for name, (rows, _) in texts_by_domain.items()}


def _sample(chars_per_domain: int, cache_dir: Path | None) -> dict[str, tuple[list[int], list[str]]]:
    from streams.sources import DomainConfig, load_documents, shipped_corpora
    from streams.splits import domain_permutation

    out = {}
    with tempfile.TemporaryDirectory(prefix="clp-tokenizer-") as tmp:
        cache = Path(cache_dir) if cache_dir is not None else Path(tmp)
        for name in shipped_corpora():
            docs = load_documents(DomainConfig(name=name, source=f"corpus:{name}"), cache)
            texts = list(docs["text"])
            rows, chosen, total = [], [], 0
            for row in domain_permutation(len(texts), SAMPLE_SEED, name)[::-1]:
                if total >= chars_per_domain:
                    break
                rows.append(int(row))
                chosen.append(texts[int(row)])
                total += len(texts[int(row)])
            out[name] = (rows, chosen)
    return out


def main(out: str | None = None, vocab_size: int = 4096) -> int:
    target = Path(out) if out is not None else SHIPPED_PATH
    if not target.parent.is_dir():  # found before the minutes of training, not after
        raise ConfigError(f"--out {target}: its folder {target.parent} does not exist", field="out")
    if target.is_dir():
        raise ConfigError(f"--out {target} is a folder; name the tokenizer file (e.g. {target / 'tokenizer.json'})", field="out")
    t0 = time.perf_counter()
    sample = _sample(CHARS_PER_DOMAIN, cache_dir=None)
    texts = [t for _, chosen in sample.values() for t in chosen]
    tok = train_tokenizer(texts, vocab_size=vocab_size, out_path=target)
    chars = sum(len(t) for t in texts)
    print(
        f"trained on {len(texts):,} documents, {chars / 1e6:.2f} M chars "
        f"({', '.join(f'{n}: {len(r)}' for n, (r, _) in sample.items())}) in {time.perf_counter() - t0:.1f} s"
    )
    print(f"wrote {target}  vocab_size={tok.vocab_size}  fingerprint={tok.fingerprint[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
