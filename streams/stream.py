"""A stream's configuration and its data: every domain loaded, validated, tokenised, split, packed.

    config = load_stream_config("experiments/configs/streams/default.yaml")
    domains = load_domains(config)        # {"math": DomainData, ...}, cached under config.cache_dir
    domains["law"].splits["eval"].segments[0]["input_ids"]      # (seq_len,) LongTensor

Most code wants the Avalanche view instead: `streams.scenario.build_stream(config)`. This module
stays free of Avalanche (a 6 s import) so that `clp data stats` starts quickly.

Build order matters for bad input: every domain's files are loaded and validated first, then
every domain is tokenised and split (a domain too small for its budget fails here), and only then
is anything packed. Errors are `StreamDataError` naming the domain (and file and line); config
mistakes (duplicate names, unknown keys, unknown domains in `order`) are `ValueError`s raised
when the config is built.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from streams.packing import PackedSegments, pack_split, tokenize_documents
from cl_platform.check import ConfigError, apply_overrides, check_keys, from_mapping, read_yaml
from streams.sources import DomainConfig, load_documents
from streams.retrieval import RetrievalConfig, insert_episodes
from streams.splits import SplitPlan, TokenBudget, adapt_part_name, plan_splits
from streams.tokenizer import Tokenizer, load_tokenizer


DEFAULT_SEQ_LEN = 512  # a stream's segment length when neither it nor a base names one


def default_cache_dir() -> Path:
    """`$CLP_CACHE`, else `~/.cache/cl_platform`."""
    return Path(os.environ.get("CLP_CACHE") or Path.home() / ".cache" / "cl_platform").expanduser()


@dataclass(frozen=True)
class StreamConfig:
    """Domains, the order in which they are streamed, segment length, budgets and seed."""

    domains: list[DomainConfig]
    order: list[str] | None = None  # domain names, repeats allowed; None = each domain once, as listed
    # Tokens per segment (each segment holds seq_len + 1 for the shifted targets). None: the base's
    # when a run reads the stream with a base (experiments/setup.py), else DEFAULT_SEQ_LEN; a built
    # stream (`resolved()`, build_stream, load_domains) always holds a number.
    seq_len: int | None = None
    token_budget: TokenBudget = field(default_factory=TokenBudget)  # default for domains without their own
    seed: int = 0  # document-level splits
    # Path to a tokenizer.json. None: the base's when a run reads the stream with a base, else the
    # shipped one (streams/assets/tokenizer.json).
    tokenizer: str | None = None
    # Recall episodes in every pretraining split (streams/retrieval.py); off by default.
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    cache_dir: str | None = None  # None = default_cache_dir()

    def __post_init__(self):
        if not isinstance(self.domains, list) or not self.domains:
            raise ValueError("domains must be a non-empty list")
        seen: set[str] = set()
        for i, d in enumerate(self.domains):
            if not isinstance(d, DomainConfig):
                raise ValueError(f"domains[{i}] must be a DomainConfig, got {type(d).__name__}")
            if d.name in seen:
                raise ValueError(f"domains[{i}]: duplicate domain name '{d.name}' (names must be unique)")
            seen.add(d.name)
        if self.order is not None:
            if not isinstance(self.order, list) or not self.order:
                raise ValueError("order must be a non-empty list of domain names (or omitted)")
            for i, name in enumerate(self.order):
                if name not in seen:
                    raise ValueError(f"order[{i}]: unknown domain {name!r}; configured domains: {sorted(seen)}")
        if self.seq_len is not None and (isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int)
                                         or self.seq_len < 2):
            raise ValueError(f"seq_len must be an int >= 2 (or omitted), got {self.seq_len!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.token_budget, TokenBudget):
            raise ValueError("token_budget must be a TokenBudget")
        if not isinstance(self.retrieval, RetrievalConfig):
            raise ValueError("retrieval must be a mapping {fraction, facts, min_distance, attributes, form}")

    def resolved(self) -> "StreamConfig":
        """This config with an unset `seq_len` at its default: what a stream is built from."""
        return self if self.seq_len is not None else replace(self, seq_len=DEFAULT_SEQ_LEN)

    @property
    def experience_domains(self) -> list[str]:
        return list(self.order) if self.order is not None else [d.name for d in self.domains]

    def domain(self, name: str) -> DomainConfig:
        return next(d for d in self.domains if d.name == name)

    def budget(self, name: str) -> TokenBudget:
        return self.domain(name).token_budget or self.token_budget

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    @classmethod
    def from_dict(cls, data: dict, base_dir: Path | None = None) -> "StreamConfig":
        """Build from a YAML mapping; relative file sources and paths resolve against `base_dir`."""
        check_keys(cls, data, "stream config")
        data = dict(data)
        if not isinstance(data.get("domains"), list):
            raise ValueError("stream config: 'domains' must be a list of domain mappings")
        data["domains"] = [
            DomainConfig.from_dict(d, f"domains[{i}]", base_dir=base_dir) for i, d in enumerate(data["domains"])
        ]
        if isinstance(data.get("token_budget"), dict):
            data["token_budget"] = from_mapping(TokenBudget, data["token_budget"], "token_budget")
        if isinstance(data.get("retrieval"), dict):
            data["retrieval"] = from_mapping(RetrievalConfig, data["retrieval"], "retrieval")
        for key in ("tokenizer", "cache_dir"):
            if base_dir is not None and isinstance(data.get(key), str) and not os.path.isabs(os.path.expanduser(data[key])):
                data[key] = str(base_dir / data[key])
        return cls(**data)


def load_stream_config(path: str | Path, overrides: Sequence[str] = ()) -> StreamConfig:
    """A stream YAML with `key=value` overrides (`seq_len=256`, `token_budget.adapt=1024`)."""
    path = Path(path)
    data = apply_overrides(read_yaml(path, "stream config"), overrides, "stream config")
    try:
        return StreamConfig.from_dict(data, base_dir=path.resolve().parent)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


@dataclass
class SplitData:
    """One packed split of one domain."""

    domain: str
    split: str  # "pretrain", "eval", "adapt", "adapt#2", ...
    segments: PackedSegments
    doc_rows: np.ndarray  # rows of DomainData.documents, in the order they were packed

    @property
    def n_docs(self) -> int:
        return len(self.doc_rows)

    @property
    def n_tokens(self) -> int:
        return self.segments.n_tokens

    @property
    def n_segments(self) -> int:
        return len(self.segments)

    @cached_property
    def dataset(self):
        """The segments as an `AvalancheDataset` (what Avalanche storage policies and metrics take)."""
        from avalanche.benchmarks.utils import AvalancheDataset

        return AvalancheDataset([self.segments])


@dataclass
class DomainData:
    name: str
    documents: Any  # datasets.Dataset with a `text` column, after filters
    plan: SplitPlan
    splits: dict[str, SplitData]  # "eval", "pretrain", "adapt", then "adapt#2", ... for recurrences

    @property
    def adapt_parts(self) -> list[SplitData]:
        return [self.splits[adapt_part_name(i)] for i in range(len(self.plan.adapt))]

    def document_ids(self, split: str) -> list[int]:
        """Row numbers (in the domain's loaded documents) of a split, e.g. to check disjointness."""
        return [int(r) for r in self.splits[split].doc_rows]


def load_domains(config: StreamConfig | str | Path, tokenizer: Tokenizer | None = None) -> dict[str, DomainData]:
    """Every configured domain's documents and packed splits (cached; see streams/packing.py)."""
    if not isinstance(config, StreamConfig):
        config = load_stream_config(config)
    config = config.resolved()
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer)
    cache_dir = config.resolved_cache_dir()
    order = config.experience_domains
    occurrences = {d.name: max(1, order.count(d.name)) for d in config.domains}  # eval-only domains get one

    documents = {d.name: load_documents(d, cache_dir) for d in config.domains}  # 1. validate every source
    tokenized, plans = {}, {}
    for d in config.domains:  # 2. tokenise and split every domain; a too-small domain stops here
        tokenized[d.name] = tokenize_documents(documents[d.name], tokenizer, d.name)
        doc_tokens = tokenized[d.name].data.column("n_tokens").to_numpy()
        plans[d.name] = plan_splits(doc_tokens, config.budget(d.name), occurrences[d.name], config.seed, d.name)

    domains: dict[str, DomainData] = {}
    for d in config.domains:  # 3. pack
        budget = config.budget(d.name)
        splits = {}
        for part, rows in plans[d.name].all_parts().items():
            if len(rows) == 0:  # a pretrain or dev budget of 0
                splits[part] = SplitData(d.name, part, _empty_segments(config.seq_len, tokenizer, d.name, part), rows)
                continue
            split_budget = budget.adapt if part.startswith("adapt") else getattr(budget, part)
            cut = budget.eval_doc_tokens if part in ("eval", "dev") else None
            packed = pack_split(tokenized[d.name], rows, split_budget, config.seq_len, tokenizer, d.name, part, cut)
            segments = PackedSegments.from_hf(packed, tokenizer.eot_id, d.name, part)
            if part == "pretrain" and config.retrieval.active:
                tokens, docs, _ = insert_episodes(segments.tokens.numpy(), segments.doc_index.numpy(), config.retrieval,
                                                  tokenizer, config.seed, d.name)
                segments = PackedSegments(tokens, docs, tokenizer.eot_id, d.name, part)
            splits[part] = SplitData(d.name, part, segments, rows)
        domains[d.name] = DomainData(d.name, documents[d.name], plans[d.name], splits)
    return domains


def _empty_segments(seq_len: int, tokenizer: Tokenizer, domain: str, split: str) -> PackedSegments:
    shape = (0, seq_len + 1)
    return PackedSegments(np.zeros(shape, np.int64), np.zeros(shape, np.int64), tokenizer.eot_id, domain, split)

