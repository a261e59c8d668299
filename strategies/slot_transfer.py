"""Fast-to-slow consolidation by slot transfer (a complementary-learning-systems design): when an
experience ends, the FwPKM slots the finished domain used most specifically are copied, keys and
values, into a slow read-only memory of the same geometry that the layer reads beside the fast
one; the fast rows are then freed (set to zero) for later domains.

    strategy: {name: slot_transfer, kwargs: {fraction: 0.05, budget: 0.5, score: tfidf, correct: true}}

- which slots: per layer, the top `fraction` of slots by the same scores as slot freezing
  (`strategies.slot_freezing.slot_scores`: TF-IDF of this experience's read counts against the
  earlier experiences', or plain usage), within a total of `budget` of the layer's slots over the
  stream; a slot transferred before may be transferred again (it was freed and rewritten);
- the slow memory: one bank per transfer, holding a copy of the layer's sub-key codebooks as they
  are at that moment and the transferred value rows; every other slot of a bank reads as zero.
  A bank is read with the layer's own queries by the same product-key lookup as the fast memory
  (top-k, softmax weights, heads averaged), and its read-out adds to the fast one
  (`FwPKM.extra_read`); with `correct` (the default) the fast writes then learn what the sum
  still misses, so a later domain that lands on a transferred slot writes the difference between
  its target and the slow content into the freed row and cancels that content for every reader
  (experiments/LOG.md, 2026-12-01); with `correct: false` they learn as if the slow memory were
  absent (`FwPKM.extra_corrected`), so the slow content stays in every read, the later domain's
  included: the capacity of the slow memory is `budget`, the size of each transfer `fraction`;
- freeing with zeros rather than fresh random rows makes the transfer exact: right after it, fast
  + slow read-outs equal the fast read-outs before it (tests/strategies/test_slot_transfer.py), so
  consolidation itself costs nothing; what it buys is that later writes no longer move those rows.

Each bank costs one more product-key lookup per FwPKM call (reported as extra compute by `clp
compare`) and (rows × (d_value + 1) + codebooks) floats. Works in `fast` and `finetune` mode (the
memory writes in both). The banks are the strategy's state, so a resumed run reads the same slow
memory; a layer only holds a reference to them (`extra_read` is not in the model's state_dict), so
every hook re-attaches them — after a resume the first hook that runs is a training batch's
`transform_batch` or the experience's end, both before any read that counts.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cl_platform.memory.product_keys import product_key_lookup
from cl_platform.strategy import Batch, Strategy, StrategyContext
from strategies.slot_freezing import check_slot_choice, slot_scores


class SlowMemory:
    """The read-only banks of one FwPKM layer, as the layer's `extra_read`: queries → read-out."""

    def __init__(self, banks: list[dict[str, Any]], num_slots: int, topk: int):
        self.topk = topk
        self._banks = []  # (codebooks, slot -> row, table + zero row), on the device of the last read
        for bank in banks:
            # Slot id -> row of the bank's table; every other slot points at a final zero row.
            ids, table = bank["ids"], bank["table"]
            rows = torch.full((num_slots,), ids.numel(), dtype=torch.long, device=table.device)
            rows[ids] = torch.arange(ids.numel(), device=table.device)
            self._banks.append((bank["keys"], rows, torch.cat([table, table.new_zeros(1, table.shape[1])])))

    def __call__(self, q: Tensor) -> Tensor:
        """q (B, T, H·Dk) → Σ over banks of the bank's read-out (B, T, Dv)."""
        if self._banks and self._banks[0][0].device != q.device:
            # Banks are made between experiences, on the host (Lightning moves the model back to
            # the CPU when a fit ends); the reads run where the queries are: move them once.
            self._banks = [tuple(t.to(q.device) for t in bank) for bank in self._banks]
        out = None
        for keys, rows, table in self._banks:
            H = keys.shape[0]
            look, _ = product_key_lookup(q.view(*q.shape[:-1], H, -1), keys, self.topk)
            idx = rows[look.idx.reshape(-1, self.topk)]
            read = F.embedding_bag(idx, table, per_sample_weights=look.weights.reshape(-1, self.topk), mode="sum")
            read = read.view(*q.shape[:-1], H, -1).mean(-2)  # heads average, as in the fast read
            out = read if out is None else out + read
        return out


class SlotTransfer(Strategy):
    def __init__(self, fraction: float = 0.05, budget: float = 0.5, score: str = "tfidf", correct: bool = True):
        check_slot_choice("slot_transfer", fraction, budget, score)
        if not isinstance(correct, bool):
            raise ValueError(f"slot_transfer: correct must be true or false, got {correct!r}")
        self.fraction, self.budget, self.score, self.correct = float(fraction), float(budget), score, correct
        self.history: list[dict[str, Tensor]] = []  # per finished experience: read counts per layer
        self.banks: dict[str, list[dict[str, Any]]] = {}  # per layer: experience, domain, keys, ids, table
        self._attached: tuple[int, int] | None = None  # (id(model), banks built) last attached

    # --- the model reads the banks -------------------------------------------------------------
    def check(self, model_config, mode, stream=None) -> None:
        if not model_config.fwpkm_layers:
            raise ValueError("slot_transfer: the model has no FwPKM layer, so there are no slots to transfer")

    def attach(self, model) -> None:
        """Point every FwPKM layer's `extra_read` at its banks (idempotent)."""
        self.check(model.config, "fast")
        layers = model.fwpkm_layers()
        version = (id(model), sum(len(b) for b in self.banks.values()))
        if self._attached == version:
            return
        for layer in layers:
            if layer.extra_read is not None and not isinstance(layer.extra_read, SlowMemory):
                raise ValueError(f"slot_transfer: {layer.name} already reads another memory beside the fast one")
            banks = self.banks.get(layer.name, [])
            layer.extra_read = SlowMemory(banks, layer.config.num_slots, layer.config.topk) if banks else None
            layer.extra_corrected = self.correct
        self._attached = version

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.attach(ctx.model)

    def transform_batch(self, batch: Batch, ctx: StrategyContext) -> Batch:
        self.attach(ctx.model)
        return batch

    # --- transfer ------------------------------------------------------------------------------
    def on_experience_end(self, ctx: StrategyContext) -> None:
        self.attach(ctx.model)
        record = {}
        for layer in ctx.model.fwpkm_layers():
            n = layer.config.num_slots
            counts = layer.read_counts.detach().cpu().clone()
            record[layer.name] = counts
            banks = self.banks.setdefault(layer.name, [])
            room = math.floor(self.budget * n) - sum(b["ids"].numel() for b in banks)
            eligible = counts > 0
            k = min(math.floor(self.fraction * n), room, int(eligible.sum()))
            if k <= 0:
                continue
            score = slot_scores(counts, [h[layer.name] for h in self.history], self.score)
            score = torch.where(eligible, score, torch.full_like(score, -math.inf))
            ids = torch.sort(-score, stable=True).indices[:k].sort().values.to(layer.values.device)  # ties: lower id
            # Copies of the codebooks and of the chosen rows only (not the whole fast state).
            banks.append({"experience": ctx.experience, "domain": ctx.domain, "keys": layer.keys.detach().clone(),
                          "ids": ids, "table": layer.values.detach()[ids]})
            layer.clear_slots(ids)
        self.history.append(record)
        self._attached = None
        self.attach(ctx.model)

    # --- report and resume ---------------------------------------------------------------------
    def transferred(self) -> dict[str, dict[str, int]]:
        """{layer: {domain: slots in the slow memory}}; a domain seen twice sums its banks."""
        out: dict[str, dict[str, int]] = {}
        for name, banks in self.banks.items():
            out[name] = {}
            for b in banks:
                out[name][b["domain"]] = out[name].get(b["domain"], 0) + int(b["ids"].numel())
        return out

    def summary(self) -> dict[str, Any]:
        return {"transferred_slots": self.transferred(),
                "banks_per_layer": {name: len(b) for name, b in self.banks.items()}}

    def state_dict(self) -> dict[str, Any]:
        return {"history": [{k: v.clone() for k, v in h.items()} for h in self.history],
                "banks": {name: [{**b, "keys": b["keys"].clone(), "ids": b["ids"].clone(),
                                  "table": b["table"].clone()} for b in banks]
                          for name, banks in self.banks.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"history", "banks"}:
            raise ValueError(f"slot_transfer: state has keys {sorted(state)}, expected ['banks', 'history']")
        self.history = [{k: v.clone() for k, v in h.items()} for h in state["history"]]
        self.banks = {name: [{**b, "keys": b["keys"].clone(), "ids": b["ids"].clone(), "table": b["table"].clone()}
                             for b in banks] for name, banks in state["banks"].items()}
        self._attached = None  # the next hook points the layers at these banks
