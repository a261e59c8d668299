"""Synthetic multi-query associative recall (MQAR): key–value pairs at the start of a sequence,
queries for their keys `distance` tokens later, beyond the attention window. Issue 8's test of
whether the fast-weight memory carries information that attention cannot reach.

    config = RecallConfig(num_pairs=8, seq_len=128)
    batch = recall_batch(config, n=32, distances=[96] * 32, seed=0)    # input_ids, targets (B, T)

Token ids: 0 and 1 unused (reserved), then `num_keys` key tokens, `num_values` value tokens and
`num_filler` filler tokens; vocabulary size `config.vocab_size`. Layout of one sequence (T =
`seq_len` + 1 tokens before the input/target shift):

    k1 v1 k2 v2 … kP vP | d filler tokens | q1 a1 q2 a2 … qP aP | filler to the end

The P keys are distinct; queries ask for every pair once, in a random order, each followed by its
answer. Targets are IGNORE_INDEX everywhere except at the query positions, where the target is
the answer (the value paired with that key): accuracy = argmax at those positions. Everything is
drawn from one numpy generator seeded by `seed`: the same arguments give the same batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cl_platform.constants import IGNORE_INDEX  # the target the model's loss skips

RESERVED = 2


@dataclass(frozen=True)
class RecallConfig:
    num_keys: int = 64
    num_values: int = 64
    num_filler: int = 126
    num_pairs: int = 8
    seq_len: int = 128  # model input length (the generator makes seq_len + 1 tokens)

    def __post_init__(self) -> None:
        for name in ("num_keys", "num_values", "num_filler", "num_pairs", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"recall.{name} must be a positive int, got {value!r}")
        if self.num_pairs > self.num_keys:
            raise ValueError(f"recall.num_pairs ({self.num_pairs}) exceeds recall.num_keys ({self.num_keys}): keys are distinct")
        if 4 * self.num_pairs > self.seq_len + 1:
            raise ValueError(f"recall.seq_len ({self.seq_len}) cannot hold {self.num_pairs} pairs and their queries")

    @property
    def vocab_size(self) -> int:
        return RESERVED + self.num_keys + self.num_values + self.num_filler

    @property
    def max_distance(self) -> int:
        """The longest gap between the pairs and the queries that fits in one sequence."""
        return self.seq_len + 1 - 4 * self.num_pairs

    def check_distance(self, distance: int) -> None:
        if isinstance(distance, bool) or not isinstance(distance, int) or not 0 <= distance <= self.max_distance:
            raise ValueError(f"recall distance {distance!r} does not fit: with {self.num_pairs} pairs and seq_len "
                             f"{self.seq_len} it must be an int in 0..{self.max_distance}")


def recall_batch(config: RecallConfig, n: int, distances, seed: int) -> dict[str, torch.Tensor]:
    """`n` sequences, sequence i with its queries `distances[i]` tokens after its pairs:
    {"input_ids", "targets": (n, seq_len) int64, "distance": (n,)}."""
    distances = list(distances)
    if len(distances) != n:
        raise ValueError(f"recall_batch: {len(distances)} distances for {n} sequences")
    for d in distances:
        config.check_distance(d)
    rng = np.random.default_rng(seed)
    P, T = config.num_pairs, config.seq_len + 1
    key0, value0 = RESERVED, RESERVED + config.num_keys
    filler0 = value0 + config.num_values
    tokens = filler0 + rng.integers(0, config.num_filler, size=(n, T))
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    for i, d in enumerate(distances):
        keys = key0 + rng.permutation(config.num_keys)[:P]
        values = value0 + rng.integers(0, config.num_values, size=P)
        tokens[i, 0:2 * P:2], tokens[i, 1:2 * P:2] = keys, values
        order = rng.permutation(P)
        start = 2 * P + d
        tokens[i, start:start + 2 * P:2], tokens[i, start + 1:start + 2 * P:2] = keys[order], values[order]
        targets[i, start:start + 2 * P:2] = values[order]  # predicted at the query token: the next token
    return {
        "input_ids": torch.from_numpy(tokens[:, :-1].copy()),
        "targets": torch.from_numpy(targets[:, :-1].copy()),
        "distance": torch.tensor(distances, dtype=torch.int64),
    }


def answers(batch: dict[str, torch.Tensor]) -> list[list[tuple[int, int, int]]]:
    """Per sequence, (position, query key, answer) of every query: the check a test can do by hand."""
    out = []
    for ids, tgt in zip(batch["input_ids"].tolist(), batch["targets"].tolist()):
        out.append([(t, ids[t], a) for t, a in enumerate(tgt) if a != IGNORE_INDEX])
    return out
