"""The stream as Avalanche objects: an ordered list of domain experiences.

    scenario = build_stream("experiments/configs/streams/default.yaml")
    for exp in scenario.adapt_stream:                 # math -> law -> code -> web
        exp.domain                                    # "math"
        train = exp.adapt_loader(batch_size=8)        # this domain's adapt segments, in order
        evals = exp.eval_loaders(batch_size=8)        # {"math": DataLoader, "law": ..., ...}
    scenario.pretrain_dataset()                       # every domain's pretrain split, for the base model

`DomainScenario` is an Avalanche `CLScenario` with three streams: `adapt_stream` (one experience
per entry of the config's `order`; a recurring domain reads fresh documents each time),
`eval_stream` and `pretrain_stream` (one experience per configured domain, in config order).
Every experience's `dataset` is an `AvalancheDataset` of packed segments, so Avalanche storage
policies (replay buffers) and metrics apply to it directly. Avalanche is used as a library only:
training reads DataLoaders (`exp.adapt_loader`, or the Lightning modules in
`streams/datamodule.py`), never an Avalanche training loop.
"""
from __future__ import annotations

from pathlib import Path

from avalanche.benchmarks.scenarios import CLScenario, DatasetExperience, EagerCLStream
from avalanche.benchmarks.utils import AvalancheDataset

from streams.datamodule import segment_loader
from streams.stream import DomainData, SplitData, StreamConfig, load_domains, load_stream_config
from streams.tokenizer import Tokenizer, load_tokenizer


class SplitExperience(DatasetExperience):
    """An Avalanche experience holding one split of one domain (`domain`, `split`, `data`)."""

    def __init__(self, data: SplitData):
        super().__init__(dataset=data.dataset)
        self.domain = data.domain
        self.split = data.split
        self.data = data


class DomainExperience(SplitExperience):
    """Same as SplitExperience (holding the domain's adapt part) plus the eval data of every domain."""

    def __init__(self, adapt: SplitData, eval_data: dict[str, SplitData], occurrence: int,
                 dev_data: dict[str, SplitData] | None = None):
        super().__init__(adapt)
        self.occurrence = occurrence  # 0 the first time the domain appears in the order, 1 the next, ...
        self.eval_data = eval_data
        self.dev_data = dev_data or {}
        self.eval_datasets = {name: d.dataset for name, d in eval_data.items()}

    def adapt_loader(self, batch_size: int, start: int = 0, num_workers: int = 0, rank: int = 0, world: int = 1):
        """The adapt segments in stream order (never shuffled); `start` skips segments (resume,
        counted over all ranks); `rank`/`world`: this rank's shard under data parallelism."""
        return segment_loader(self.data.segments, batch_size, shuffle=False, start=start, num_workers=num_workers,
                              rank=rank, world=world)

    def eval_loaders(self, batch_size: int, num_workers: int = 0, split: str = "eval") -> dict:
        """One in-order DataLoader per domain's `split` ("eval", or "dev" to choose settings
        without touching the eval split), in configured domain order."""
        if split not in ("eval", "dev"):
            raise ValueError(f"eval_loaders: split must be 'eval' or 'dev', got {split!r}")
        data = self.eval_data if split == "eval" else self.dev_data
        missing = [name for name in self.eval_data if name not in data or not data[name].n_docs]
        if missing:
            raise ValueError(f"domain(s) {missing} have no {split} split; set token_budget.{split} in the stream config")
        return {
            name: segment_loader(d.segments, batch_size, shuffle=False, num_workers=num_workers)
            for name, d in data.items()
        }

    def __repr__(self) -> str:
        return f"DomainExperience({self.current_experience}: {self.domain}, {self.split}, {len(self.dataset)} segments)"


class DomainScenario(CLScenario):
    """`adapt_stream`, `eval_stream` and `pretrain_stream` over loaded domains (see module doc)."""

    def __init__(self, config: StreamConfig, tokenizer: Tokenizer, domains: dict[str, DomainData]):
        self.config = config
        self.tokenizer = tokenizer
        self.domains = domains  # configured order
        eval_data = {name: d.splits["eval"] for name, d in domains.items()}
        dev_data = {name: d.splits["dev"] for name, d in domains.items()}
        seen: dict[str, int] = {}
        experiences = []
        for name in config.experience_domains:
            k = seen.get(name, 0)
            seen[name] = k + 1
            experiences.append(DomainExperience(domains[name].adapt_parts[k], eval_data, occurrence=k, dev_data=dev_data))
        pretrain = [SplitExperience(d.splits["pretrain"]) for d in domains.values() if d.splits["pretrain"].n_docs]
        super().__init__(
            [
                EagerCLStream("adapt", experiences),
                EagerCLStream("eval", [SplitExperience(d) for d in eval_data.values()]),
                EagerCLStream("pretrain", pretrain),
            ]
        )

    @property
    def eval_domains(self) -> list[str]:
        """Domain names in the order of `eval_loaders()` / the data modules' val loaders."""
        return list(self.domains)

    def __len__(self) -> int:
        return len(self.adapt_stream)

    def __iter__(self):
        return iter(self.adapt_stream)

    def __getitem__(self, i: int) -> DomainExperience:
        return self.adapt_stream[i]

    def pretrain_dataset(self):
        """Every domain's pretrain segments as one AvalancheDataset, domains in name order (shuffle
        to train). Name order, not the order the stream file lists them: the mixture, and so the
        base model, must not depend on how a file happens to list its domains."""
        parts = [self.domains[name].splits["pretrain"].segments for name in sorted(self.domains)
                 if self.domains[name].splits["pretrain"].n_docs]
        if not parts:
            raise ValueError("no domain has a pretrain split (every token_budget.pretrain is 0)")
        return AvalancheDataset(parts)


def build_stream(config: StreamConfig | str | Path, tokenizer: Tokenizer | None = None) -> DomainScenario:
    """Load (cached), validate, tokenise, split and pack every domain; build the scenario."""
    if not isinstance(config, StreamConfig):
        config = load_stream_config(config)
    config = config.resolved()
    if tokenizer is None:
        tokenizer = load_tokenizer(config.tokenizer)
    return DomainScenario(config, tokenizer, load_domains(config, tokenizer))
