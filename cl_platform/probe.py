"""A base's behaviour in three numbers, so that a base built by other code can be told apart from
one that computes another function.

    probe = measure(weights, model_config, rule)         # {"read": ..., "write": ..., "after_write": ...}
    write_probe(folder, weights, model_config, rule)     # <folder>/probe.json, beside base.ckpt
    diff = probe_difference(folder, weights, model_config, rule)   # max |Δ| in nats; None without a probe

A base records the per-file hashes of the code that built it (`cl_platform.provenance.BASE_CODE`),
and a hash differs at any edit: a comment, a refactor, a faster kernel of the same function. For a
cached base that is the right test (other training code would build another base: it is rebuilt).
A *given* base (`base_checkpoint`: a shipped reference base, a colleague's file) is an artifact,
not something this code would rebuild; what matters is whether this code computes the same
function with its weights. The probe answers that: losses on fixed random tokens, on
T = 512 (beyond the 128-token window, and four write chunks) —
- `read`: writes off (the base's memory as it is);
- `write`: the same tokens with writes on (the FwPKM write rule is exercised: chunked writes
  read by later chunks);
- `after_write`: the same tokens again, reading the memory the previous call wrote.
Measured in float64 (`DTYPE`): the function of these weights, not the float32 rounding of the
machine that measures it. In float32 the writes carry rounding far above float32's epsilon: on
the shipped reference bases, `read` agreed to 1e-6 nats between a 2-core AMD EPYC and an Intel
Xeon with AMX, but `write` and `after_write` moved by up to 7.5e-4 (seed 0) and 2.5e-4 (seed 2),
more than the 1e-4 tolerance, so the Intel machine refused the shipped base that the AMD one had
built (`experiments/LOG.md`, 2026-12-03). Weights perturbed by 1e-7 (relative) move the float64
probe by ≤ 2e-6: the function is not chaotic, the float32 write arithmetic is what is lossy. In
float64 that rounding is ~1e9 times smaller, so a given base passes on every machine kind; the loss itself is summed in float32 (the model
casts its logits), which bounds the probe's resolution at ~1e-6 nats. Equal to `TOLERANCE`
(1e-4 nats) means the same function; a change of the read, the write rule, attention or the
weights' meaning moves at least one of the three by far more. A probe.json without `dtype` is an
older float32 probe and is measured in float32, as it was recorded.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

PROBE_FILE = "probe.json"
TOLERANCE = 1e-4  # nats
BATCH, SEQ, SEED = 2, 512, 0
DTYPE = torch.float64
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def measure(weights: dict, model_config, rule, dtype: torch.dtype = DTYPE) -> dict[str, Any]:
    """The probe of a model with these weights under this code (in `dtype`, no graph)."""
    from cl_platform.memory.fwpkm import one_process
    from cl_platform.model import FwPKMLM

    model = FwPKMLM(model_config, rule).to(dtype)
    model.load_state_dict(weights)  # cast to the model's dtype
    model.eval()
    g = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(2, model_config.vocab_size, (BATCH, SEQ + 1), generator=g)  # ids 0, 1: EOT, PAD
    x, y = tokens[:, :-1], tokens[:, 1:]
    out = {"tokens": [BATCH, SEQ], "seed": SEED, "dtype": str(dtype).removeprefix("torch.")}
    with torch.no_grad(), one_process():  # a function of the weights alone, whatever ranks are running
        model.set_writes(False)
        out["read"] = float(model(x, y)[1])
        model.set_writes(True)
        out["write"] = float(model(x, y)[1])
        out["after_write"] = float(model(x, y)[1])
    return out


def write_probe(folder: Path, weights: dict, model_config, rule) -> Path:
    from cl_platform.atomic import atomic_write_json

    path = Path(folder) / PROBE_FILE
    atomic_write_json(path, measure(weights, model_config, rule))
    return path


def probe_difference(folder: Path, weights: dict, model_config, rule) -> float | None:
    """max |recorded − measured| over the probe's losses; None when the folder has no probe
    (or an unreadable one: then nothing can be said, as without one)."""
    path = Path(folder) / PROBE_FILE
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        keys = ("read", "write", "after_write")
        if not all(isinstance(recorded.get(k), (int, float)) for k in keys):
            return None
        dtype = DTYPES[recorded.get("dtype", "float32")]  # no dtype: a float32 probe of older code
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = measure(weights, model_config, rule, dtype)
    diff = max(abs(float(recorded[k]) - now[k]) for k in keys)
    return diff if math.isfinite(diff) else math.inf
