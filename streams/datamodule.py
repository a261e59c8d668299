"""How training reads the stream: resumable DataLoaders over packed segments.

    exp.adapt_loader(8, start=16)                # an experience's adapt segments, in stream order
    PretrainDataModule(scenario, batch_size=8)   # base model: all pretrain splits, shuffled

Data position is resumable: every loader draws indices from a `ResumableSampler` (deterministic
order from a seed and an epoch; `start` skips what a previous run already consumed). The runners
count the batches they have trained on and set the position (`start`, `set_position(epoch,
start)`); the pretraining data module keeps it in Lightning's `state_dict` hooks.
"""
from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableSampler(Sampler[int]):
    """Indices 0..n-1, in order or in a seeded per-epoch permutation, starting at `start`; under
    data parallelism, this rank's share of them.

    `start` applies to the next pass only (the pass after it starts at 0 again), so resuming
    in the middle of an epoch is `set_epoch(e); set_start(samples_done_in_e)`. `start` counts
    samples of the whole (global) order, as the runners count what all ranks have consumed.

    Sharding (`world > 1`) is that of torch's DistributedSampler without shuffling: the order is
    padded with its own first indices to a multiple of `world`, and rank r reads positions r,
    r + world, ... . It is done here, not by Lightning's wrapper, so that a resumed pass shards the
    *rest of the same padded order*: sharding a shortened order would pad it with other samples
    whenever the rest is not a multiple of `world`, and a resumed DDP run would differ.
    """

    def __init__(self, n: int, shuffle: bool = False, seed: int = 0, start: int = 0, rank: int = 0, world: int = 1):
        if not (isinstance(world, int) and world >= 1 and 0 <= rank < world):
            raise ValueError(f"rank {rank} / world {world}: need 0 <= rank < world")
        self.n = n
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.rank, self.world = rank, world
        self.set_start(start)

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at every epoch start
        self.epoch = epoch

    def set_start(self, start: int) -> None:
        if not 0 <= start <= self._padded:
            raise ValueError(f"start={start} is outside 0..{self._padded}")
        if start % self.world:
            raise ValueError(f"start={start} is not a multiple of the {self.world} ranks: every step consumes "
                             f"the same number of samples on each rank")
        self.start = start

    @property
    def _padded(self) -> int:
        return -(-self.n // self.world) * self.world if self.n else 0

    def order(self) -> np.ndarray:
        """The global order of one pass, padded to a multiple of `world` (torch's rule)."""
        base = np.random.default_rng([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
        pad = self._padded - self.n
        return np.concatenate([base, np.resize(base, pad)]) if pad else base

    def __iter__(self):
        start, self.start = self.start, 0
        yield from (int(i) for i in self.order()[start + self.rank::self.world])

    def __len__(self) -> int:
        return (self._padded - self.start) // self.world

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(state["epoch"])
        self.set_start(state["start"])


def segment_loader(
    dataset: Dataset, batch_size: int, shuffle: bool = False, seed: int = 0, start: int = 0, num_workers: int = 0,
    rank: int = 0, world: int = 1,
) -> DataLoader:
    """A DataLoader of segment dicts (`input_ids`, `targets`, `doc_index`, `doc_start`: (B, T));
    with `world > 1`, rank `rank`'s shard (the Trainer must then not shard it again)."""
    sampler = ResumableSampler(len(dataset), shuffle=shuffle, seed=seed, start=start, rank=rank, world=world)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers)


class PretrainDataModule(L.LightningDataModule):
    """Train = every domain's pretrain split, one seeded permutation per epoch."""

    def __init__(self, scenario, batch_size: int = 8, seed: int = 0, num_workers: int = 0):
        super().__init__()
        self.scenario = scenario
        self.batch_size = batch_size
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

