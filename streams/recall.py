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

Composite keys (issue 53): with `key_tokens: m` a key is m tokens drawn from the `num_keys`
symbols (16: hex, 10: digits, as the paper's "ID-xxxx"), the P keys distinct as combinations
while single symbols repeat across keys, so only the combination names a key; with
`value_tokens: L` a value is L tokens. A pair is then `k¹…kᵐ v¹…vᴸ`, a query the same, and
the targets are the L answer tokens, predicted from the last key token and from each answer
token but the last (teacher forced: a query is answered when all L are the argmax, `exact_match`).
At m = L = 1 the generator draws exactly what it drew before these fields.
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
    key_tokens: int = 1  # m: a key is m symbols of the num_keys (16: hex, 10: digits)
    value_tokens: int = 1  # L: a value is L tokens

    def __post_init__(self) -> None:
        for name in ("num_keys", "num_values", "num_filler", "num_pairs", "seq_len", "key_tokens", "value_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"recall.{name} must be a positive int, got {value!r}")
        if self.num_pairs > self.num_keys ** self.key_tokens:
            raise ValueError(f"recall.num_pairs ({self.num_pairs}) exceeds recall.num_keys ({self.num_keys}) ** recall.key_tokens "
                             f"({self.key_tokens}) = {self.num_keys ** self.key_tokens} keys: keys are distinct")
        if 2 * self.num_pairs * self.pair_width > self.seq_len + 1:
            raise ValueError(f"recall.seq_len ({self.seq_len}) cannot hold {self.num_pairs} pairs and their queries")

    @property
    def pair_width(self) -> int:
        """Tokens of one pair (and of one query with its answer)."""
        return self.key_tokens + self.value_tokens

    @property
    def vocab_size(self) -> int:
        return RESERVED + self.num_keys + self.num_values + self.num_filler

    @property
    def max_distance(self) -> int:
        """The longest gap between the pairs and the queries that fits in one sequence."""
        return self.seq_len + 1 - 2 * self.num_pairs * self.pair_width

    def queries_at(self, distance: int) -> int:
        """Position of the first query at `distance`: what precedes it (pairs and filler) is the
        context an n-iter reading reads before the queries."""
        return self.num_pairs * self.pair_width + distance

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
    m, L, w = config.key_tokens, config.value_tokens, config.pair_width
    key0, value0 = RESERVED, RESERVED + config.num_keys
    filler0 = value0 + config.num_values
    tokens = filler0 + rng.integers(0, config.num_filler, size=(n, T))
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    # The draws at m = L = 1 are the ones made before composite keys, in the same order.
    places = config.num_keys ** np.arange(m - 1, -1, -1)  # (m,) a code's base-num_keys digits, first symbol first
    answer_at = (m - 1) + np.arange(L)  # (L,) offsets in a query of the positions predicting its answer
    for i, d in enumerate(distances):
        if m == 1:
            keys = key0 + rng.permutation(config.num_keys)[:P, None]  # (P, 1)
        else:  # P distinct combinations; their symbols may repeat across keys
            codes = rng.choice(config.num_keys ** m, size=P, replace=False)
            keys = key0 + (codes[:, None] // places) % config.num_keys  # (P, m)
        values = value0 + rng.integers(0, config.num_values, size=P if L == 1 else (P, L)).reshape(P, L)
        pairs = np.concatenate([keys, values], axis=1)  # (P, w)
        tokens[i, :P * w] = pairs.ravel()
        order = rng.permutation(P)
        start = P * w + d
        tokens[i, start:start + P * w] = pairs[order].ravel()
        # The answer is predicted one position early: at the last key token and each answer token but the last.
        targets[i, start + (w * np.arange(P)[:, None] + answer_at)] = values[order]
    return {
        "input_ids": torch.from_numpy(tokens[:, :-1].copy()),
        "targets": torch.from_numpy(targets[:, :-1].copy()),
        "distance": torch.tensor(distances, dtype=torch.int64),
    }


def exact_match(predicted: torch.Tensor, targets: torch.Tensor, value_tokens: int) -> tuple[int, int]:
    """(queries answered exactly, queries) from the argmax `predicted` and `targets` (B, T): the
    target positions, in order, are the queries' answers, `value_tokens` each; a query counts
    when every one of its answer tokens is right."""
    mask = targets != IGNORE_INDEX
    right = (predicted[mask] == targets[mask]).reshape(-1, value_tokens)  # (queries, L): row-major = in order
    return int(right.all(dim=1).sum()), right.shape[0]


def answers(batch: dict[str, torch.Tensor]) -> list[list[tuple[int, int, int]]]:
    """Per sequence, (position, query key, answer) of every query: the check a test can do by hand."""
    out = []
    for ids, tgt in zip(batch["input_ids"].tolist(), batch["targets"].tolist()):
        out.append([(t, ids[t], a) for t, a in enumerate(tgt) if a != IGNORE_INDEX])
    return out
