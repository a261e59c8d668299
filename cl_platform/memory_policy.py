"""What evaluation does to the fast-weight memory: an explicit, named policy recorded with results.

Evaluation that silently keeps (or silently resets) test-time memory makes results incomparable
(ARCHITECTURE.md, anti-patterns), so every evaluation goes through one of these:

    frozen  writes disabled while reading every domain's eval split; the memory (keys, values)
            and the read counts are restored afterwards. Evaluation never changes the model.
            The FwPKM paper's continual-learning protocol; the default.
    stream  each domain's eval split is read in order with writes on (test-time training, the
            paper's stream-perplexity protocol), starting from the memory as it was before the
            evaluation; everything is restored after each domain and at the end, so domains do
            not see each other's writes and training never sees evaluation's.

    session = get_memory_policy("frozen").open(model)   # snapshot
    for domain, loader in loaders.items():
        session.start_domain()
        ...forward passes...
    session.close()                                     # restore: model bit-identical to before
"""

from __future__ import annotations

from torch import Tensor, nn


class MemorySession:
    """One evaluation under a policy: snapshot on open, restore on close."""

    def __init__(self, model: nn.Module, writes: bool):
        self.layers = list(model.fwpkm_layers())
        self.writes = writes
        self._saved: list[tuple[bool, Tensor, Tensor, Tensor]] = [
            (layer.writes_enabled, layer.keys.detach().clone(), layer.values.detach().clone(),
             layer.read_counts.detach().clone())
            for layer in self.layers
        ]
        for layer in self.layers:
            layer.writes_enabled = writes

    def _restore_memory(self) -> None:
        for layer, (_, keys, values, counts) in zip(self.layers, self._saved):
            layer.keys.copy_(keys)
            layer.values.copy_(values)
            layer.read_counts.copy_(counts)

    def start_domain(self) -> None:
        """Before the first batch of each domain: with writes on, start from the saved memory."""
        if self.writes:
            self._restore_memory()

    def close(self) -> None:
        self._restore_memory()
        for layer, (enabled, *_) in zip(self.layers, self._saved):
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


POLICIES: dict[str, type[EvalMemoryPolicy]] = {"frozen": FrozenMemory, "stream": StreamMemory}


def get_memory_policy(name: str) -> EvalMemoryPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown evaluation memory policy {name!r}; allowed: {sorted(POLICIES)}") from None
