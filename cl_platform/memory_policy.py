"""What evaluation does to the fast-weight memory: an explicit, named policy recorded with results.

Evaluation that silently keeps (or silently resets) test-time memory makes results incomparable
(docs/architecture.md, anti-patterns), so every evaluation goes through one of these:

    frozen  writes disabled while reading every domain's eval split; the whole fast state (keys,
            values, read counts, write mask) is restored afterwards. Evaluation never changes
            the model. The FwPKM paper's continual-learning protocol; the default.
    stream  each domain's eval split is read in order with writes on (test-time training, the
            paper's stream-perplexity protocol), starting from the memory as it was before the
            evaluation; everything is restored before each domain and at the end, so domains do
            not see each other's writes and training never sees evaluation's.
    reset   a control, not a protocol: as `frozen`, but every FwPKM layer's value table is first
            re-drawn from its initial distribution (a fixed seed per layer, so every evaluation
            sees the same fresh table); keys, slow weights and the rest stay. A run under `reset`
            beside one under `frozen` shows how much of each row comes from what the memory's
            values hold. Restored afterwards like the others.

    session = get_memory_policy("frozen").open(model)   # snapshot
    for domain, loader in loaders.items():
        session.start_domain()
        ...forward passes...
    session.close()                                     # restore: model bit-identical to before
"""

from __future__ import annotations

import torch
from torch import nn


class MemorySession:
    """One evaluation under a policy: snapshot on open (`model.snapshot_memory()` and each FwPKM
    layer's `writes_enabled`), restore on close. `model` is a `cl_platform.model.FwPKMLM` (or
    anything with its `fwpkm_layers()`, `snapshot_memory()` and `restore_memory()`)."""

    def __init__(self, model: nn.Module, writes: bool):
        self.model = model
        self.writes = writes
        self._memory = model.snapshot_memory()
        self._routed = False  # the last domain read a routed memory instead of the saved one
        self._writes_enabled = [layer.writes_enabled for layer in model.fwpkm_layers()]
        for layer in model.fwpkm_layers():
            layer.writes_enabled = writes

    def start_domain(self, memory=None) -> None:
        """Before the first batch of each domain: start from `memory` where one is given (a
        strategy's routing, `Strategy.eval_memory`), else, with writes on or after a routed
        domain, from the saved memory; with writes off the memory is then the saved one anyway."""
        if memory is not None:
            self.model.restore_memory(memory)
            self._routed = True
        elif self.writes or self._routed:
            self.model.restore_memory(self._memory)
            self._routed = False

    def close(self) -> None:
        self.model.restore_memory(self._memory)
        for layer, enabled in zip(self.model.fwpkm_layers(), self._writes_enabled):
            layer.writes_enabled = enabled


class EvalMemoryPolicy:
    name: str = ""
    writes: bool = False

    def open(self, model: nn.Module) -> MemorySession:
        return MemorySession(model, self.writes)


class FrozenMemory(EvalMemoryPolicy):
    name = "frozen"
    writes = False


class StreamMemory(EvalMemoryPolicy):
    name = "stream"
    writes = True


class ResetMemory(EvalMemoryPolicy):
    """Same as `frozen` except that the fast values are re-drawn for the evaluation (a control)."""

    name = "reset"
    writes = False
    SEED = 0  # the fresh table of layer i is drawn from a generator seeded SEED + i

    def open(self, model: nn.Module) -> MemorySession:
        session = MemorySession(model, self.writes)  # snapshot first: close() puts the values back
        for i, layer in enumerate(model.fwpkm_layers()):
            generator = torch.Generator(device=layer.values.device).manual_seed(self.SEED + i)
            layer.reset_slots(torch.arange(layer.values.shape[0], device=layer.values.device), generator)
        return session


POLICIES: dict[str, type[EvalMemoryPolicy]] = {"frozen": FrozenMemory, "stream": StreamMemory, "reset": ResetMemory}


def get_memory_policy(name: str) -> EvalMemoryPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown evaluation memory policy {name!r}; allowed: {sorted(POLICIES)}") from None
