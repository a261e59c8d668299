"""The shipped default stream at full size (slow: tokenises all four shipped corpora once)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from streams.stream import load_domains, load_stream_config
from streams.tokenizer_build import training_sample

DEFAULT = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "streams" / "default.yaml"


@pytest.mark.slow
def test_default_stream_cold_build_and_tokenizer_sample(stream_cache, count_work):
    # Timings of the cold build are benchmarks (experiments/LOG.md), not asserted here.
    cfg = dataclasses.replace(load_stream_config(DEFAULT), cache_dir=str(stream_cache / "default"))
    encode, pack = count_work
    domains = load_domains(cfg)
    for name in ("math", "law", "code", "web"):
        d, b = domains[name], cfg.budget(name)
        for split, budget in [("pretrain", b.pretrain), ("adapt", b.adapt), ("eval", b.eval), ("dev", b.dev)]:
            assert d.splits[split].n_tokens == budget
            assert len(d.splits[split].segments) == budget // cfg.seq_len
        parts = [set(d.document_ids(split)) for split in ("eval", "adapt", "pretrain", "dev")]
        assert sum(map(len, parts)) == len(set().union(*parts))  # disjoint
        assert len(d.document_ids("eval")) >= b.eval_docs and len(d.document_ids("dev")) >= b.eval_docs
    assert [n for n in ("math", "law", "code", "web") if domains[n].splits["pretrain"].n_tokens] == ["web"]
    # The shipped tokenizer never saw an evaluated or streamed document of the default stream (it
    # may have seen web's dev documents, which come after web's pretraining documents).
    sample = training_sample(cache_dir=Path(cfg.cache_dir))
    assert set(sample) == {"math", "law", "code", "web"}
    for name, rows in sample.items():
        held = set(domains[name].document_ids("eval")) | set(domains[name].document_ids("adapt"))
        assert held.isdisjoint(rows), name
    # A second load reads the cache: no document is tokenised or packed again.
    encoded, packed = encode.calls, pack.calls
    again = load_domains(cfg)
    assert (encode.calls, pack.calls) == (encoded, packed)
    assert torch.equal(again["law"].splits["eval"].segments.tokens, domains["law"].splits["eval"].segments.tokens)
