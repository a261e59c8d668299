"""Counting the ops that make the host wait for the device, on any device (the CPU included).

    with SyncAudit() as audit:
        fwpkm_core(q, v, g, state, config, rule)
    audit.total      # 0: nothing in the call reads a tensor on the host
    audit.counts     # Counter of the sync ops seen, by name
    audit.ops        # every aten op seen (a proxy for kernel launches on a GPU)

`torch.cuda.set_sync_debug_mode` sees syncs only on a GPU; this audit sees, on the CPU too, the ops
that would sync there: those that read a value on the host (`_local_scalar_dense`: `int(t)`,
`bool(t)`, `.item()`) and those whose output shape depends on data (`unique`, `nonzero`,
`masked_select`, `bincount`, indexing with a boolean mask, a hidden `nonzero`). It is library code,
not a test helper, because the suite (tests/cl_platform/memory/test_sync_free.py) and the GPU speed
check's dry run (experiments/studies/gpu_speed_check.py) count with the same rules.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that wait for the device (the host reads a value) or whose output shape depends on data.
SYNC_OPS = frozenset({"_local_scalar_dense", "_unique2", "unique_dim", "unique_consecutive", "nonzero",
                      "masked_select", "bincount"})


class SyncAudit(TorchDispatchMode):
    """Counts the aten ops in SYNC_OPS, and `index` with a boolean index (a hidden `nonzero`);
    `ops` counts every aten op that reaches the dispatcher, views included."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func._overloadpacket.__name__
        if name in SYNC_OPS:
            self.counts[name] += 1
        elif func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.counts["index.Tensor(bool)"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())
