"""How training reads the stream: DataLoaders and Lightning data modules over packed segments.

    dm = ExperienceDataModule(scenario, batch_size=8)
    for t in range(len(scenario)):
        dm.set_experience(t)          # train = adapt segments of experience t, in stream order
        trainer = L.Trainer(...)      # a fresh Trainer per experience (see ARCHITECTURE.md)
        trainer.fit(module, datamodule=dm)   # val = one loader per domain's eval split

    PretrainDataModule(scenario, batch_size=8)   # base model: all pretrain splits, shuffled

Data position is resumable: every loader draws indices from a `ResumableSampler` (deterministic
order from a seed and an epoch; `start` skips what a previous run already consumed). The runner,
which counts the batches it has trained on, sets the position (`set_experience(t, start)`,
`set_position(epoch, start)`); the data modules keep it in Lightning's `state_dict` hooks so it
travels with checkpoints.
"""
from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableSampler(Sampler[int]):
    """Indices 0..n-1, in order or in a seeded per-epoch permutation, starting at `start`.

    `start` applies to the next pass only (the pass after it starts at 0 again), so resuming
    in the middle of an epoch is `set_epoch(e); set_start(samples_done_in_e)`.
    """

    def __init__(self, n: int, shuffle: bool = False, seed: int = 0, start: int = 0):
        self.n = n
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.set_start(start)

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at every epoch start
        self.epoch = epoch

    def set_start(self, start: int) -> None:
        if not 0 <= start <= self.n:
            raise ValueError(f"start={start} is outside 0..{self.n}")
        self.start = start

    def order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def __iter__(self):
        start, self.start = self.start, 0
        yield from (int(i) for i in self.order()[start:])

    def __len__(self) -> int:
        return self.n - self.start

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self.set_start(state["start"])


def segment_loader(
    dataset: Dataset, batch_size: int, shuffle: bool = False, seed: int = 0, start: int = 0, num_workers: int = 0
) -> DataLoader:
    """A DataLoader of segment dicts (`input_ids`, `targets`, `doc_index`, `doc_start`: (B, T))."""
    sampler = ResumableSampler(len(dataset), shuffle=shuffle, seed=seed, start=start)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers)


class _EvalLoaders:
    """Shared by both data modules: validation = one in-order loader per domain's eval split."""

    scenario: Any
    eval_batch_size: int
    num_workers: int

    def val_dataloader(self) -> list[DataLoader]:
        # Lightning numbers the loaders (dataloader_idx); `scenario.eval_domains[idx]` names them.
        return [
            segment_loader(d.splits["eval"].segments, self.eval_batch_size, num_workers=self.num_workers)
            for d in self.scenario.domains.values()
        ]

    def test_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()


class ExperienceDataModule(_EvalLoaders, L.LightningDataModule):
    """Train = the adapt segments of the current experience, in stream order (never shuffled)."""

    def __init__(self, scenario, batch_size: int = 8, eval_batch_size: int | None = None, num_workers: int = 0):
        super().__init__()
        self.scenario = scenario
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.experience = 0
        self.start = 0  # segments of the current experience already consumed (resume)

    def set_experience(self, index: int, start: int = 0) -> None:
        if not 0 <= index < len(self.scenario):
            raise IndexError(f"experience {index} is outside 0..{len(self.scenario) - 1}")
        self.experience, self.start = index, start

    @property
    def current(self):
        return self.scenario[self.experience]

    def train_dataloader(self) -> DataLoader:
        return self.current.adapt_loader(self.batch_size, start=self.start, num_workers=self.num_workers)

    def state_dict(self) -> dict[str, int]:
        return {"experience": self.experience, "start": self.start}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.set_experience(state_dict["experience"], state_dict["start"])


class PretrainDataModule(_EvalLoaders, L.LightningDataModule):
    """Train = every domain's pretrain split, one seeded permutation per epoch."""

    def __init__(
        self, scenario, batch_size: int = 8, eval_batch_size: int | None = None, seed: int = 0, num_workers: int = 0
    ):
        super().__init__()
        self.scenario = scenario
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.sampler_state = {"epoch": 0, "start": 0}

    def set_position(self, epoch: int, start: int = 0) -> None:
        """Resume at sample `start` of the permutation of `epoch`."""
        self.sampler_state = {"epoch": epoch, "start": start}

    def train_dataloader(self) -> DataLoader:
        data = self.scenario.pretrain_dataset()
        loader = segment_loader(data, self.batch_size, shuffle=True, seed=self.seed, num_workers=self.num_workers)
        loader.sampler.load_state_dict(self.sampler_state)
        return loader

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "sampler": dict(self.sampler_state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = state_dict["seed"]
        self.sampler_state = dict(state_dict["sampler"])

