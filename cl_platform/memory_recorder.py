"""What the fast memory's slots hold and when its gate opens, recorded during a run (`cl.inspect`).

    recorder = MemoryRecorder(lambda i: tokenizer.decode([i]))  # a RunCallback for ContinualRunner
    ContinualRunner(..., callbacks=[recorder])                  # writes run_dir/inspect/

Every FwPKM layer reports each call's addressing and gates through its `observer` knob; this
callback keeps, bounded in size whatever the run's length:

- writers: while experience t streams its domain, every token t' whose query picks slot i writes
  the look-ahead target of the token after it into i with weight g_t'·w_t'i (the last token of
  each write chunk, and rows a strategy froze, write nothing). Per slot the EXAMPLES strongest
  writes are kept, with the token, the next token (what the write teaches the slot to return) and
  ±CONTEXT tokens; per slot the number and summed weight of writes.
- readers: at row t (the evaluation right after experience t), the tokens of that domain's eval
  split that read each slot, weight g·w, kept the same way; per slot the number of reads.
- gates: at the last row, the gate of every FwPKM layer for the first GATE_TOKENS tokens of every
  domain's eval split (with their ids and documents).

Files (atomic, rewritten after every row, so a killed run keeps every finished experience):
    inspect/slots.json    per layer, per experience: the TOP_SLOTS slots its domain wrote most
                          (summed write weight), each with counts and writer / reader examples
    inspect/counts.npz    writes_<layer>_<t>, reads_<layer>_<t> (N,) int32: per-slot counts, for
                          which slots a domain owns and how many survive later domains (analysis/)
    inspect/gates.npz     <domain>_ids, <domain>_doc (int32), <domain>_<layer> (float16 gates),
                          pretrain_counts (int64, per vocabulary id: the base's pretraining tokens)
    inspect/tokens.json   {id: text} for every id these files name

Recording never changes the run: it reads what the layers computed (test: the same results with
and without it), so `cl.inspect` is not part of a run's identity. It is not checkpointed: a run
resumed in the middle of an experience records that experience from the resume on, and
slots.json marks it `"partial": true`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from cl_platform.atomic import atomic_write, atomic_write_json
from cl_platform.callbacks import RunCallback
from cl_platform.constants import IGNORE_INDEX
from cl_platform.device import HOST

# Everything recorded lives in host memory (HOST), whatever device the model runs on: the tables
# are bounded and read back by numpy, and a GPU's memory is the model's. Each call's tensors are
# copied there once, at the start of `_observe`.
TOP_SLOTS = 8  # slots shown per layer and experience
EXAMPLES = 5  # writer and reader examples kept per slot
CONTEXT = 10  # tokens of context on each side of an example
GATE_TOKENS = 8192  # gate values kept per domain (the first tokens of its eval split)


class TopPerSlot:
    """The K largest-weight events of every slot, over any number of updates (O(N·K) memory).
    An event is (slot, weight, ref): `ref` says where its token is (an index into a token store)."""

    def __init__(self, num_slots: int, k: int):
        self.k = k
        self.weight = torch.full((num_slots, k), -torch.inf, device=HOST)
        self.ref = torch.full((num_slots, k), -1, dtype=torch.long, device=HOST)

    def update(self, slots: Tensor, weight: Tensor, ref: Tensor) -> None:
        if not slots.numel():
            return
        touched = torch.unique(slots)
        old_w, old_r = self.weight[touched], self.ref[touched]  # (U, K)
        keep = old_r >= 0
        s = torch.cat([slots, touched.repeat_interleave(self.k)[keep.flatten()]])
        w = torch.cat([weight.float(), old_w[keep]])
        r = torch.cat([ref, old_r[keep]])
        # Group by slot, heaviest first inside a group (two stable sorts), then rank in the group.
        order = torch.argsort(w, descending=True, stable=True)
        order = order[torch.argsort(s[order], stable=True)]
        s, w, r = s[order], w[order], r[order]
        start = torch.searchsorted(s, s)  # first position of each event's slot
        rank = torch.arange(s.numel(), device=s.device) - start
        top = rank < self.k
        self.weight[touched] = -torch.inf
        self.ref[touched] = -1
        self.weight[s[top], rank[top]] = w[top]
        self.ref[s[top], rank[top]] = r[top]


class _Tokens:
    """The (B, T) segments a phase read, in order: a ref b·T + t counts from the first segment."""

    def __init__(self):
        self.ids: list[Tensor] = []
        self.targets: list[Tensor] = []
        self.rows = 0
        self._joined: tuple[Tensor, Tensor] | None = None

    def add(self, ids: Tensor, targets: Tensor) -> int:
        """Store a batch; returns the ref of its first token."""
        first = self.rows * ids.shape[1]
        self.ids.append(ids.detach().cpu())
        self.targets.append(targets.detach().cpu())
        self.rows += ids.shape[0]
        self._joined = None
        return first

    def example(self, ref: int) -> dict[str, Any]:
        if self._joined is None:
            self._joined = torch.cat(self.ids), torch.cat(self.targets)
        ids, targets = self._joined
        T = ids.shape[1]
        b, t = divmod(int(ref), T)
        nxt = int(targets[b, t])
        return {"before": ids[b, max(0, t - CONTEXT):t].tolist(), "token": int(ids[b, t]),
                "next": None if nxt == IGNORE_INDEX else nxt,
                "after": ids[b, t + 1:t + 1 + CONTEXT].tolist()}


class _Phase:
    """What one experience records, per layer: its writers, and its domain's readers at its row."""

    def __init__(self, experience: int, domain: str, partial: bool):
        self.experience, self.domain, self.partial = experience, domain, partial
        self.adapt, self.eval = _Tokens(), _Tokens()
        self.writers: dict[str, TopPerSlot] = {}
        self.readers: dict[str, TopPerSlot] = {}
        self.write_count: dict[str, Tensor] = {}
        self.write_weight: dict[str, Tensor] = {}
        self.read_count: dict[str, Tensor] = {}


class MemoryRecorder(RunCallback):
    """Records slots and gates during a ContinualRunner run (see the module docstring).
    `token_text(id)`: the text of a token id; `pretrain_counts` (V,): how often each id occurs in
    the base model's pretraining data (saved with the gates, for frequent / rare classes)."""

    def __init__(self, token_text: Callable[[int], str | None], pretrain_counts: Tensor | None = None):
        self.token_text = token_text
        self.pretrain_counts = pretrain_counts
        self.phase: _Phase | None = None
        self.mode: str | None = None  # "write" (a training batch), "read" (a row's eval batch), None
        self.first_ref = 0
        self.rows_in_batch = 0
        self.eval_domain: str | None = None
        self.gates: dict[str, dict[str, list[Tensor]]] = {}
        self.gate_ids: dict[str, list[Tensor]] = {}
        self.gate_docs: dict[str, list[Tensor]] = {}
        self._attached = False
        self._layer_ids: set[int] = set()  # the run model's layers (a strategy's copy of the model is not recorded)

    # --- wiring --------------------------------------------------------------------------------
    def _attach(self, pl_module) -> None:
        if self._attached:
            return
        for layer in pl_module.model.fwpkm_layers():
            if layer.observer is not None:
                raise RuntimeError(f"{layer.name}: another observer is attached; one recorder per model")
            layer.observer = self._observe
            self._layer_ids.add(id(layer))
        self._attached = True

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._attach(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        ctx = pl_module.ctx
        if self.phase is None or self.phase.experience != ctx.experience:
            # A phase that begins after some of its segments were streamed is a resumed one.
            self.phase = _Phase(ctx.experience, ctx.domain, partial=pl_module.position.segments_done > 0)
        self.mode = "write"
        self.rows_in_batch = batch["input_ids"].shape[0]  # the stream's rows; a replay strategy appends others after
        self.first_ref = self.phase.adapt.add(batch["input_ids"], batch["targets"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.mode = None  # forgetting-curve evaluations run after this and are not recorded

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.eval_domain = pl_module.eval_domains[dataloader_idx]
        self.rows_in_batch = batch["input_ids"].shape[0]
        self.mode = "read"
        if self.phase is not None and self.eval_domain == self.phase.domain:
            self.first_ref = self.phase.eval.add(batch["input_ids"], batch["targets"])
        if self._last_row(pl_module):
            self._keep_gate_tokens(batch)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.mode = None

    @staticmethod
    def _last_row(pl_module) -> bool:
        """A row's evaluation after the last experience (the context is the experience just trained)."""
        ctx = pl_module.ctx
        return ctx is not None and ctx.experience == ctx.num_experiences

    # --- what the layers report ----------------------------------------------------------------
    def _observe(self, layer, g: Tensor, idx: Tensor, weights: Tensor) -> None:
        """A FwPKM call: gates g (B, T), picks idx / weights (B, T, H, k) of every token."""
        if self.mode is None or id(layer) not in self._layer_ids:
            return  # between batches (forgetting curves, strategy hooks), or a copy such as LwF's teacher
        B = self.rows_in_batch
        writable = layer.write_mask[idx[:B]].to(HOST) if self.mode == "write" else None
        g, idx, weights = g[:B].float().to(HOST), idx[:B].to(HOST), weights[:B].float().to(HOST)
        T, H, k = idx.shape[1], idx.shape[2], idx.shape[3]
        if self.mode == "read" and self.eval_domain is not None and self.eval_domain in self.gate_ids:
            kept = self.gates.setdefault(self.eval_domain, {}).setdefault(layer.name, [])
            budget = GATE_TOKENS - sum(x.numel() for x in kept)
            if budget > 0:
                kept.append(g.flatten()[:budget].half())
        phase = self.phase
        if phase is None or (self.mode == "read" and self.eval_domain != phase.domain):
            return
        N = layer.values.shape[0]
        ref = (self.first_ref + torch.arange(B * T, device=HOST)).view(B, T, 1, 1).expand(B, T, H, k)
        w = g.view(B, T, 1, 1) * weights
        valid = torch.ones_like(w, dtype=torch.bool)
        if self.mode == "write":
            rule = layer.rule
            if rule.lookahead:  # the last token of each write chunk has no target inside it
                t = torch.arange(T, device=HOST)
                step = min(rule.chunk, T)
                last = ((t + 1) % step == 0) | (t == T - 1)
                valid &= ~last.view(1, T, 1, 1)
            valid &= writable
            store, count = phase.writers, phase.write_count
            phase.write_weight.setdefault(layer.name, torch.zeros(N, dtype=torch.float64, device=HOST)).index_add_(
                0, idx[valid], w[valid].double())
        else:
            store, count = phase.readers, phase.read_count
        slots = idx[valid]
        count.setdefault(layer.name, torch.zeros(N, dtype=torch.long, device=HOST)).index_add_(0, slots, torch.ones_like(slots))
        store.setdefault(layer.name, TopPerSlot(N, EXAMPLES)).update(slots, w[valid], ref[valid])

    def _keep_gate_tokens(self, batch) -> None:
        domain = self.eval_domain
        ids = self.gate_ids.setdefault(domain, [])
        budget = GATE_TOKENS - sum(x.numel() for x in ids)
        if budget <= 0:
            return
        ids.append(batch["input_ids"].flatten()[:budget].int().to(HOST))
        doc = batch.get("doc_index")
        doc = doc.flatten()[:budget].int().to(HOST) if doc is not None else torch.full_like(ids[-1], -1)
        self.gate_docs.setdefault(domain, []).append(doc)

    # --- files ---------------------------------------------------------------------------------
    def on_results_row(self, runner, row: int) -> None:
        folder = Path(runner.run_dir) / "inspect"
        folder.mkdir(parents=True, exist_ok=True)
        phase = self.phase
        if row >= 1 and phase is not None and phase.experience == row:
            self._write_slots(folder, phase)
            self.phase = None
        if self.gates and row == runner.results.matrix.num_experiences:
            self._write_gates(folder)

    def _write_slots(self, folder: Path, phase: _Phase) -> None:
        path = folder / "slots.json"
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"experiences": []}
        data["experiences"] = [e for e in data["experiences"] if e["experience"] < phase.experience]
        entry = {"experience": phase.experience, "domain": phase.domain, "partial": phase.partial, "layers": {}}
        counts = {}
        if (folder / "counts.npz").is_file():
            with np.load(folder / "counts.npz") as saved:
                counts = {key: saved[key] for key in saved.files}
        for name, weight in phase.write_weight.items():
            top = torch.argsort(weight, descending=True, stable=True)[:TOP_SLOTS]
            writes, reads = phase.write_count[name], phase.read_count.get(name)
            slots = []
            for slot in top.tolist():
                if weight[slot] <= 0:
                    break
                slots.append({
                    "slot": slot, "writes": int(writes[slot]), "write_weight": float(weight[slot]),
                    "reads": int(reads[slot]) if reads is not None else 0,
                    "writers": _examples(phase.writers[name], slot, phase.adapt),
                    "readers": _examples(phase.readers[name], slot, phase.eval) if name in phase.readers else [],
                })
            entry["layers"][name] = slots
            counts[f"writes_{name}_{phase.experience}"] = writes.numpy().astype(np.int32)
            counts[f"reads_{name}_{phase.experience}"] = (reads if reads is not None else torch.zeros_like(writes)).numpy().astype(np.int32)
        data["experiences"].append(entry)
        data["bounds"] = {"top_slots": TOP_SLOTS, "examples": EXAMPLES, "context": CONTEXT}
        _write_npz(folder / "counts.npz", counts)
        self._merge_tokens(folder, data)
        atomic_write_json(path, data)

    def _write_gates(self, folder: Path) -> None:
        arrays = {}
        for domain, ids in self.gate_ids.items():
            arrays[f"{domain}_ids"] = torch.cat(ids).numpy().astype(np.int32)
            arrays[f"{domain}_doc"] = torch.cat(self.gate_docs[domain]).numpy().astype(np.int32)
            for layer, parts in self.gates.get(domain, {}).items():
                arrays[f"{domain}_{layer}"] = torch.cat(parts).numpy().astype(np.float16)
        if self.pretrain_counts is not None:
            arrays["pretrain_counts"] = self.pretrain_counts.numpy().astype(np.int64)
        _write_npz(folder / "gates.npz", arrays)
        self._merge_tokens(folder, {"ids": [int(i) for a in self.gate_ids.values() for x in a for i in x.tolist()]})

    def _merge_tokens(self, folder: Path, data: Any) -> None:
        path = folder / "tokens.json"
        known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        for i in _ids_in(data):
            known.setdefault(str(i), self.token_text(i))
        atomic_write_json(path, known)


def _examples(top: TopPerSlot, slot: int, tokens: _Tokens) -> list[dict[str, Any]]:
    out = []
    for w, ref in zip(top.weight[slot].tolist(), top.ref[slot].tolist()):
        if ref >= 0:
            out.append({"weight": w, **tokens.example(ref)})
    return out


def _ids_in(data: Any):
    """Every token id in recorded examples (fields before/token/next/after) or an "ids" list."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("before", "after", "ids") and isinstance(value, list):
                yield from (v for v in value if isinstance(v, int))
            elif key in ("token", "next") and isinstance(value, int):
                yield value
            else:
                yield from _ids_in(value)
    elif isinstance(data, list):
        for value in data:
            yield from _ids_in(value)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_write(path, lambda f: np.savez_compressed(f, **arrays), binary=True)
