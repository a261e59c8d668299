"""Shared fixtures: a small real stream over slices of the four shipped corpora, built once."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from streams.sources import DomainConfig, FilterConfig
from streams.splits import TokenBudget
from streams.stream import StreamConfig

SEQ_LEN = 64
BUDGET = TokenBudget(pretrain=2560, adapt=1280, eval=640)  # 40 / 20 / 10 segments of 64 tokens
# First documents of each shipped corpus (source order): enough for the budget above, with room
# for a recurrence, and quick to tokenise.
SLICES = {"math": 120, "law": 6, "code": 15, "web": 60}


def small_config(cache_dir, **overrides) -> StreamConfig:
    domains = [
        DomainConfig(name=name, source=f"corpus:{name}", filters=FilterConfig(max_documents=n))
        for name, n in SLICES.items()
    ]
    base = StreamConfig(domains=domains, seq_len=SEQ_LEN, token_budget=BUDGET, seed=0, cache_dir=str(cache_dir))
    return dataclasses.replace(base, **overrides)


@pytest.fixture(scope="session")
def small():
    """The small stream's parameters and config factory (tests import nothing from conftest)."""
    return SimpleNamespace(config=small_config, budget=BUDGET, seq_len=SEQ_LEN, slices=SLICES, domains=list(SLICES))


@pytest.fixture(scope="session")
def stream_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("clp-cache")


@pytest.fixture(scope="session")
def small_scenario(stream_cache):
    from streams.scenario import build_stream

    return build_stream(small_config(stream_cache))


class CallCounter:
    """Counts calls through a wrapped function (tokenisation / packing work done)."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def count_work(monkeypatch):
    """Patch the tokenizer's batch encoder and the packer with counters; returns both counters."""
    import streams.packing as packing
    from streams.tokenizer import Tokenizer

    encode = CallCounter(Tokenizer.encode_batch)
    pack = CallCounter(packing.pack_tokens)
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, texts: encode(self, texts))
    monkeypatch.setattr(packing, "pack_tokens", pack)
    return encode, pack
