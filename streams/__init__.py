"""Domain data: shipped corpora, loading through `datasets`, tokenisation and packing, the stream.

    from streams import build_stream
    scenario = build_stream("experiments/configs/streams/default.yaml")

Modules, in pipeline order: `sources` (where documents come from, validation), `splits`
(document-level pretrain / adapt / eval), `packing` (tokenise and pack, cached), `stream`
(config and per-domain data), `scenario` (Avalanche view), `datamodule` (DataLoaders, Lightning).
Names below are imported on first use, so `import streams` stays cheap (Avalanche alone takes
seconds to import).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "build_stream": "streams.scenario",
    "DomainScenario": "streams.scenario",
    "DomainExperience": "streams.scenario",
    "StreamConfig": "streams.stream",
    "load_stream_config": "streams.stream",
    "load_domains": "streams.stream",
    "DomainConfig": "streams.sources",
    "FilterConfig": "streams.sources",
    "TokenBudget": "streams.splits",
    "StreamDataError": "streams.errors",
    "PretrainDataModule": "streams.datamodule",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'streams' has no attribute {name!r}")
