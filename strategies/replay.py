"""Replay: a buffer of segments from past experiences, mixed into every training batch.

    strategy: {name: replay, kwargs: {size: 64, policy: balanced, ratio: 0.25}}

Storage is Avalanche's (`avalanche.training.storage_policy`): `reservoir` keeps a uniform sample
of every segment streamed so far (`ReservoirSamplingBuffer`), `balanced` one reservoir per
experience with the room split evenly (`ExperienceBalancedBuffer`, adaptive). The buffer holds
segment ids (experience, index into its adapt split), added when an experience ends, so it only
ever holds past experiences; the segments themselves are read from the stream when replayed.
`size` counts segments; `tokens` instead gives the size in tokens (size = tokens // seq_len).

Every training batch of B segments gets round(ratio · B) (at least 1) buffered segments appended,
drawn with replacement from a generator seeded by (seed, step), so a resumed run draws the same.
In `fast` mode the appended segments are read with writes on, beside the current domain, so the
memory is refreshed on past domains (as iterative reading refreshes a context); in `finetune`
mode they are mixed batches for the outer optimiser. Under DDP every rank appends the same
segments (the draw depends on the step only).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from cl_platform.device import HOST
from cl_platform.strategy import Batch, Strategy, StrategyContext

POLICIES = ("reservoir", "balanced")


class _Ids(torch.utils.data.Dataset):
    """Segment ids as a dataset, so that Avalanche's storage policies can sample them."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids  # (n, 2) long: experience (1-based), segment index

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


def _as_dataset(ids: torch.Tensor):
    from avalanche.benchmarks.utils import AvalancheDataset

    return AvalancheDataset([_Ids(ids)])


def _ids_of(dataset) -> torch.Tensor:
    if len(dataset) == 0:
        return torch.zeros(0, 2, dtype=torch.long, device=HOST)
    return torch.stack([dataset[i] for i in range(len(dataset))])


class Replay(Strategy):
    def __init__(self, size: int | None = 64, policy: str = "balanced", ratio: float = 0.25, tokens: int | None = None,
                 seed: int = 0):
        if (size is None) == (tokens is None):
            raise ValueError("replay: give exactly one of size (segments) and tokens")
        for name, value in (("size", size), ("tokens", tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"replay: {name} must be a positive int, got {value!r}")
        if policy not in POLICIES:
            raise ValueError(f"replay: policy must be one of {POLICIES}, got {policy!r}")
        if not (isinstance(ratio, (int, float)) and 0 < ratio <= 4):
            raise ValueError(f"replay: ratio must be in (0, 4] (buffered segments per current segment), got {ratio!r}")
        self.size, self.tokens, self.policy, self.ratio, self.seed = size, tokens, policy, float(ratio), int(seed)
        self.storage = None  # built on first use, when the segment length is known
        self.seq_len: int | None = None  # tokens per segment, known from the first experience offered

    def check(self, model_config, mode, stream=None) -> None:
        if stream is None:
            return
        # The buffer holds past experiences only: all but the last can ever enter it.
        past = list(stream)[:-1]
        segments = sum(len(exp.data.segments) for exp in past)
        seq_len = past[0].data.segments.seq_len if past else 1
        size = self.size if self.size is not None else max(1, self.tokens // seq_len)
        if size > segments:
            what = f"size {self.size}" if self.size is not None else f"tokens {self.tokens} ({size} segments)"
            raise ValueError(f"replay: buffer {what} is larger than the data it can hold: the experiences before "
                             f"the last have {segments} adapt segments in all")

    # --- the buffer ---------------------------------------------------------------------------
    def _storage(self, seq_len: int):
        if self.storage is None:
            from avalanche.training.storage_policy import ExperienceBalancedBuffer, ReservoirSamplingBuffer

            size = self.size if self.size is not None else max(1, self.tokens // seq_len)
            self.storage = ReservoirSamplingBuffer(size) if self.policy == "reservoir" else \
                ExperienceBalancedBuffer(size, adaptive_size=True)
        return self.storage

    def buffered(self) -> torch.Tensor:
        """(n, 2) ids of the buffered segments: experience (1-based), segment index."""
        if self.storage is None:
            return torch.zeros(0, 2, dtype=torch.long, device=HOST)
        return _ids_of(self.storage.buffer)

    def add(self, experience: int, n_segments: int, seq_len: int) -> None:
        """Offer an experience's `n_segments` adapt segments to the storage policy."""
        ids = torch.stack([torch.full((n_segments,), experience, device=HOST), torch.arange(n_segments, device=HOST)], dim=1)
        self.seq_len = seq_len
        storage = self._storage(seq_len)
        if self.policy == "reservoir":
            storage.update_from_dataset(_as_dataset(ids))
        else:
            storage.post_adapt(None, SimpleNamespace(dataset=_as_dataset(ids)))

    def on_experience_end(self, ctx: StrategyContext) -> None:
        segments = ctx.require("current", "replay").data.segments
        self.add(ctx.experience, len(segments), segments.seq_len)

    # --- mixing -------------------------------------------------------------------------------
    def draw(self, step: int, batch_size: int) -> torch.Tensor:
        """The buffered ids appended at `step` (empty while the buffer is)."""
        ids = self.buffered()
        if len(ids) == 0:
            return ids
        k = max(1, round(self.ratio * batch_size))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return ids[torch.randint(0, len(ids), (k,), generator=g, device=HOST)]

    def transform_batch(self, batch: Batch, ctx: StrategyContext) -> Batch:
        picks = self.draw(ctx.global_step, batch["input_ids"].shape[0])
        if len(picks) == 0:
            return batch
        stream = ctx.require("stream", "replay")
        rows = [stream[int(t) - 1].data.segments[int(i)] for t, i in picks]
        return {key: torch.cat([value, torch.stack([r[key] for r in rows]).to(value.device)])
                for key, value in batch.items()}

    def summary(self) -> dict[str, Any]:
        """Buffered segments per experience (1-based), as `strategy.json` shows them, and
        `stored_tokens`: the stream's tokens they hold (what `clp compare` shows as data kept)."""
        ids = self.buffered()
        exps, counts = torch.unique(ids[:, 0], return_counts=True) if len(ids) else ([], [])
        return {"buffered_segments": {str(int(e)): int(c) for e, c in zip(exps, counts)},
                "stored_tokens": len(ids) * (self.seq_len or 0)}

    # --- resume -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.storage is None:
            return {"storage": None}
        s = self.storage
        if self.policy == "reservoir":
            groups = {0: s}
        else:
            groups = s.buffer_groups
        return {"storage": {"max_size": s.max_size, "num_exps": getattr(s, "_num_exps", None),
                            "groups": {int(k): {"ids": _ids_of(g.buffer), "weights": g._buffer_weights.clone(),
                                                "max_size": g.max_size} for k, g in groups.items()}}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"storage"}:
            raise ValueError(f"replay: state has keys {sorted(state)}, expected ['storage']")
        saved = state["storage"]
        self.storage = None
        if saved is None:
            return
        from avalanche.training.storage_policy import ExperienceBalancedBuffer, ReservoirSamplingBuffer

        def group(entry):
            g = ReservoirSamplingBuffer(entry["max_size"])
            g.buffer = _as_dataset(entry["ids"])
            g._buffer_weights = entry["weights"].clone()
            return g

        if self.policy == "reservoir":
            self.storage = group(saved["groups"][0])
        else:
            s = ExperienceBalancedBuffer(saved["max_size"], adaptive_size=True)
            s._num_exps = saved["num_exps"]
            s.buffer_groups = {int(k): group(v) for k, v in saved["groups"].items()}
            self.storage = s
