"""Self-generated replay ("sleep"): same as replay (strategies/replay.py) except that what is
replayed was written by the model itself, never taken from the stream: no training data is kept.

    strategy: {name: generative_replay, kwargs: {samples: 32, length: 512, ratio: 0.5, temperature: 1.0}}

When an experience ends, `samples` texts of `length` tokens are drawn from the model with its
memory as the experience left it (cl_platform/sample.py: read, never written; the run goes on
exactly as it would without the draw). They are what the memory makes the model say after the
domain: in `fast` mode, re-reading them later with writes on asks the memory to predict again what
it predicted then (pseudo-rehearsal, Robins 1995; generative replay, Shin et al. 2017, with the
model as its own generator). After the last experience nothing is drawn (nothing follows).

Every training batch of B segments gets round(ratio · B) (at least 1) rows appended, each made of
generated texts (each starting with `<|endoftext|>`, as a document does) concatenated to the
segment length, drawn with replacement from all experiences' texts by a generator seeded by
(seed, step), so a resumed run draws the same. In `finetune` mode the rows are mixed batches for the
outer optimiser (classic pseudo-rehearsal). What is kept: samples × (length + 1) int32 token ids
per past experience (`summary()` says how many bytes).
"""

from __future__ import annotations

from typing import Any

import torch

from cl_platform.device import HOST
from cl_platform.sample import sample
from cl_platform.strategy import Batch, Strategy, StrategyContext

class GenerativeReplay(Strategy):
    def __init__(self, samples: int = 32, length: int = 512, ratio: float = 0.5, temperature: float = 1.0,
                 seed: int = 0):
        for name, value in (("samples", samples), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"generative_replay: {name} must be a positive int, got {value!r}")
        if not (isinstance(ratio, (int, float)) and 0 < ratio <= 4):
            raise ValueError(f"generative_replay: ratio must be in (0, 4] (generated rows per current segment), got {ratio!r}")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"generative_replay: temperature must be a number > 0, got {temperature!r}")
        self.samples, self.length, self.ratio = samples, length, float(ratio)
        self.temperature, self.seed = float(temperature), int(seed)
        self.texts: dict[int, torch.Tensor] = {}  # experience (1-based) -> (samples, length + 1) int32

    def check(self, model_config, mode, stream=None) -> None:
        if stream is None:
            return
        seq_len = list(stream)[0].data.segments.seq_len
        if self.length > seq_len:
            raise ValueError(f"generative_replay: length {self.length} is longer than the stream's segments "
                             f"({seq_len} tokens); a generated text must fit in a replayed row")

    def on_experience_end(self, ctx: StrategyContext) -> None:
        if ctx.num_experiences and ctx.experience >= ctx.num_experiences:
            return
        eot = ctx.require("current", "generative_replay").data.segments.eot_id  # the stream's <|endoftext|>
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + ctx.experience)
        texts = sample(ctx.model, self.samples, self.length, generator=g, temperature=self.temperature, start=eot)
        self.texts[ctx.experience] = texts.to(torch.int32)

    def pool(self) -> torch.Tensor:
        """(n, length + 1) every kept text, experiences in order."""
        if not self.texts:
            return torch.zeros(0, self.length + 1, dtype=torch.int32, device=HOST)
        return torch.cat([self.texts[t] for t in sorted(self.texts)])

    def rows(self, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
        """(k, seq_len + 1) long: the generated rows appended at `step` (k = 0 while nothing is kept)."""
        pool = self.pool()
        if len(pool) == 0:
            return torch.zeros(0, seq_len + 1, dtype=torch.long, device=HOST)
        k = max(1, round(self.ratio * batch_size))
        per_row = -(-(seq_len + 1) // pool.shape[1])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        picks = torch.randint(0, len(pool), (k, per_row), generator=g, device=HOST)
        return pool[picks].flatten(1)[:, :seq_len + 1].long()  # (k, seq_len + 1)

    def transform_batch(self, batch: Batch, ctx: StrategyContext) -> Batch:
        ids = batch["input_ids"]
        rows = self.rows(ctx.global_step, ids.shape[0], ids.shape[1])
        if len(rows) == 0:
            return batch
        inputs, targets = rows[:, :-1], rows[:, 1:]
        starts = inputs == rows[:1, :1]  # every row begins with a text, and every text with <|endoftext|>
        # each generated text is a document of its row, starting at its <|endoftext|> (as packing marks them)
        extra = {"input_ids": inputs, "targets": targets, "doc_index": starts.long().cumsum(1) - 1, "doc_start": starts}
        missing = set(batch) - set(extra)
        if missing:
            raise ValueError(f"generative_replay: cannot make generated rows for batch fields {sorted(missing)}")
        return {key: torch.cat([value, extra[key].to(device=value.device, dtype=value.dtype)]) for key, value in batch.items()}

    def summary(self) -> dict[str, Any]:
        """Generated texts kept per experience (1-based) and their size: tokens the model wrote, no stream data."""
        pool = self.pool()
        return {"generated_texts": {str(t): len(v) for t, v in sorted(self.texts.items())},
                "generated_tokens": int(pool.numel()), "bytes": int(pool.numel() * pool.element_size())}

    def state_dict(self) -> dict[str, Any]:
        return {"texts": {int(t): v.clone() for t, v in self.texts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"texts"}:
            raise ValueError(f"generative_replay: state has keys {sorted(state)}, expected ['texts']")
        self.texts = {int(t): v.clone().to(torch.int32) for t, v in state["texts"].items()}
