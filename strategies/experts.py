"""Per-domain experts with oracle routing: the ceiling a consolidation method is measured against,
not a method (it keeps a whole memory per domain and is told each evaluation's domain).

    strategy: {name: experts}

Every experience starts from its domain's memory: a fresh one (the fast state as the stream found
it: keys, values and write mask; the read counts stay the runner's), or the domain's expert where
the domain comes back (math -> law -> math), so no domain writes over another's. When an
experience ends, its memory is kept as that domain's expert. Evaluation reads, for each domain,
that domain's expert (`eval_memory`): the domain being trained reads the live memory, a finished
one its kept expert, one not yet trained the fresh memory. In `fast` mode nothing else changes
between experiences, so under the `frozen` policy a finished domain's loss never moves: the
forgetting is 0 by construction, and the gain is what a memory reaches on a domain when it does
not start from the others' writes. A consolidation method that keeps one memory can at best
approach this row (the per-domain-expert bound of the mixture-of-memories and sparse-memory
finetuning papers).

What is kept: one fast state per finished domain plus the fresh one (`summary()["bytes"]`).
`fast` mode only: in `finetune` the shared slow weights move under every expert, so the row
would bound nothing.
"""

from __future__ import annotations

from typing import Any

from cl_platform.memory.fwpkm import FastWeightState, memory_from_state, memory_to_state
from cl_platform.strategy import Strategy, StrategyContext


class Experts(Strategy):
    routes_eval_memory = True

    def __init__(self):
        self.fresh: list[FastWeightState] | None = None  # the memory as the stream found it
        self.kept: dict[str, list[FastWeightState]] = {}  # finished domain -> its memory
        self.training: str | None = None  # the domain of the experience in progress

    def check(self, model_config, mode, stream=None) -> None:
        if mode != "fast":
            raise ValueError("experts: 'fast' mode only (in 'finetune' the shared slow weights move under every expert)")
        if not model_config.fwpkm_layers:
            raise ValueError("experts: the model has no FwPKM layer, so there is no memory to give each domain")

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        model = ctx.model
        if self.fresh is None:
            self.fresh = model.snapshot_memory()
        # the domain's own memory (fresh, or its expert where the domain recurs); the read counts
        # are left as the runner set them (other strategies' scores and the usage statistics are
        # per experience)
        start, live = self.kept.get(ctx.domain, self.fresh), model.snapshot_memory()
        model.restore_memory([s._replace(read_counts=l.read_counts) for s, l in zip(start, live)])
        self.training = ctx.domain

    def on_experience_end(self, ctx: StrategyContext) -> None:
        self.kept[ctx.domain] = ctx.model.snapshot_memory()
        self.training = None

    def eval_memory(self, domain: str) -> list[FastWeightState] | None:
        if domain == self.training or self.fresh is None:
            return None  # the live memory: the expert being trained (or nothing has started)
        return self.kept.get(domain, self.fresh)

    def summary(self) -> dict[str, Any]:
        states = ([self.fresh] if self.fresh is not None else []) + list(self.kept.values())
        size = sum(t.numel() * t.element_size() for snap in states for s in snap for t in s)
        return {"experts": sorted(self.kept), "bytes": int(size)}

    def state_dict(self) -> dict[str, Any]:
        return {"fresh": memory_to_state(self.fresh), "kept": {d: memory_to_state(s) for d, s in self.kept.items()},
                "training": self.training}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"fresh", "kept", "training"}:
            raise ValueError(f"experts: state has keys {sorted(state)}, expected ['fresh', 'kept', 'training']")
        self.fresh = memory_from_state(state["fresh"])
        self.kept = {d: memory_from_state(s) for d, s in state["kept"].items()}
        self.training = state["training"]
