"""The one prepared device check (issue 23): everything a lent GPU must show, in one table.

    clp bench device              # on a CUDA machine, ≤ 10 minutes on one H200
    clp bench device --dry-run    # the same code on this machine's CPU at toy sizes (a test runs it)

Rows:
  tests        tests/cl_platform/test_device.py on this device (the CUDA parameters; skipped in the
               dry run, which is itself run by the suite)
  reference    the FwPKM layer in float32 on the device against the same layer in float64 on the CPU:
               the largest difference over outputs, fast-weight states after the writes and
               gradients (target ≤ 1e-4)
  layer        read + write tokens/s of this layer at the paper's size (N = 262,144 slots, d = 768,
               d_k = d_v = 512, one head, top-8, C = 256, B × T = 4 × 2,048), and of the public PyTorch port
               (`fast-weight-product-key-memory` 0.2.2, when installed) on the same input; target ≥ 20×
  layer×4, ×8  the same at 4 and 8 times the batch (diagnostic: a layer bound by kernel launches
               gains in proportion to the batch, a GPU-bound one does not)
  step         one training step of the `paper` preset (FwPKM at layers 2, 6, 10) against its
               attention-only twin: ms, ratio (target ≤ 1.3×; the paper's code: ~2.8×), peak memory
  step×4       the same at 4 times the batch (diagnostic)
  pretrain     tokens/s of the `small` preset's pretraining step at the reference bases' segment
               length (2,048), random tokens (the general corpus does not travel to a lent machine)

Sizes shrink in the dry run so that it takes seconds; the table says which sizes it used.
"""
from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
# The paper's layer (docs/fwpkm.md Defaults) and the toy one of the dry run.
FULL = dict(d=768, subkeys=512, d_key=512, d_value=512, heads=1, topk=8, chunk=256, batch=4, seq=2048)
TOY = dict(d=64, subkeys=16, d_key=32, d_value=32, heads=1, topk=4, chunk=32, batch=2, seq=128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn: Callable[[], None], device: torch.device, reps: int) -> float:
    fn()  # warm-up: allocator, kernels' first launch
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _peak_mb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def reference_error(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """Largest |`dtype` on `device` − float64 on the CPU| over the layer's output, input gradient,
    fast-weight states after the writes and parameter gradients (tests/cl_platform/test_device.py
    asserts the same comparison)."""
    from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule

    def layer():
        torch.manual_seed(0)
        return FwPKM(32, FwPKMConfig(num_subkeys=16, d_key=16, d_value=16, topk=4), WriteRule(chunk=8))

    x64 = torch.randn(2, 40, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.linspace(-1, 1, 32, dtype=torch.float64)
    out = {}
    for name, mod, x in (("ref", layer().double(), x64.clone().requires_grad_()),
                         ("dev", layer().to(device, dtype), x64.to(device, dtype).requires_grad_())):
        mod.train()
        y = mod(x)
        (y * w.to(y)).sum().backward()
        out[name] = {"y": y.detach(), "dx": x.grad, "keys": mod.keys.detach(), "values": mod.values.detach(),
                     **{n: p.grad for n, p in mod.named_parameters()}}
    return max((out["dev"][k].to("cpu", torch.float64) - a).abs().max().item() for k, a in out["ref"].items())


def make_layer(size: dict, device: torch.device):
    """This FwPKM layer at `size` (a FULL- or TOY-like dict) on `device`, drawn from torch's global generator."""
    from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule

    return FwPKM(size["d"], FwPKMConfig(num_subkeys=size["subkeys"], d_key=size["d_key"], d_value=size["d_value"],
                                        heads=size["heads"], topk=size["topk"]), WriteRule(chunk=size["chunk"])).to(device)


def make_port(size: dict, device: torch.device):
    """The public PyTorch port of FwPKM (`fast-weight-product-key-memory` 0.2.2) at the same size,
    or None when it is not installed."""
    try:
        from fast_weight_product_key_memory import fwPKM
    except ImportError:
        return None
    return fwPKM(size["d"], heads=size["heads"], chunk_size=size["chunk"], num_memories=size["subkeys"] ** 2,
                 dim_queries_keys=size["heads"] * size["d_key"], dim_values=size["heads"] * size["d_value"],
                 topk=size["topk"]).to(device)


def layer_rates(device: torch.device, size: dict, reps: int) -> dict[str, float | None]:
    """Tokens/s of one read + write pass (no graph) of this layer and of the public port."""
    torch.manual_seed(0)
    x = torch.randn(size["batch"], size["seq"], size["d"], device=device)
    tokens = size["batch"] * size["seq"]
    ours = make_layer(size, device)
    ours.eval()

    def run_ours():
        with torch.no_grad():
            ours(x)

    rates: dict[str, float | None] = {"ours": tokens / _median_seconds(run_ours, device, reps), "port": None}
    port = make_port(size, device)
    if port is None:
        return rates

    def run_port():
        with torch.no_grad():
            port(x)

    rates["port"] = tokens / _median_seconds(run_port, device, reps)
    return rates


def step_times(device: torch.device, preset: str, batch: int, seq: int, reps: int) -> dict[str, tuple[float, float | None]]:
    """(ms per training step, peak MB) of `preset` and of its attention-only twin (same preset,
    no memory layers), as LMModule trains: forward through the writes, backward, clip, AdamW."""
    from cl_platform.lm_module import LMModule, OptimSettings
    from cl_platform.memory.fwpkm import WriteRule
    from cl_platform.model import FwPKMLM, ModelConfig
    from cl_platform.optim import MixedAdamW

    precision = "bf16-mixed" if device.type == "cuda" else "32-true"
    vocab = 4096
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
    out = {}
    for name, layers in (("fwpkm", {}), ("attention", {"fwpkm_layers": [], "pkm_layers": []})):
        torch.manual_seed(0)
        config = dataclasses.replace(ModelConfig.from_preset(preset), vocab_size=vocab, **layers)
        m = LMModule(FwPKMLM(config, WriteRule(chunk=min(256, seq))).to(device), phase="pretrain",
                     optim=OptimSettings(lr=1e-3, grad_clip=1.0), precision=precision)
        opt = MixedAdamW(m.model.optimizer_groups(0.1, 1e-3))
        _reset_peak(device)
        seconds = _median_seconds(lambda: _train_step(m, opt, tok[:, :-1], tok[:, 1:]), device, reps)
        out[name] = (seconds * 1e3, _peak_mb(device))
        del m, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def _train_step(m, opt, x, y) -> None:
    """One training step as LMModule takes it: forward through the writes, backward, its own
    clipping of the dense gradients, AdamW."""
    m.model.train()
    with m.autocast():
        _, loss = m.model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    m._clip_gradients()
    opt.step()


def device_tests() -> str:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cl_platform/test_device.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=480)
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit {proc.returncode}"
    if proc.returncode != 0:  # the table says only "failed": the lease is short, so show why now
        print(proc.stdout, proc.stderr[-3000:], sep="\n")
    return last.strip("= ")


def main(dry_run: bool = False) -> int:
    from cl_platform.check import ConfigError

    if not dry_run and not torch.cuda.is_available():
        raise ConfigError("clp bench device: torch sees no CUDA device on this machine; "
                          "--dry-run runs the same code on the CPU at toy sizes")
    device = torch.device("cpu" if dry_run else "cuda")
    size, reps = (TOY, 2) if dry_run else (FULL, 5)
    name = "CPU (dry run)" if dry_run else torch.cuda.get_device_name(device)
    print(f"device check on {name}; torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}; "
          f"layer size N = {size['subkeys'] ** 2:,}, d = {size['d']}, B × T = {size['batch']} × {size['seq']}")
    rows: list[tuple[str, str, str]] = []
    rows.append(("tests", "skipped (dry run)" if dry_run else device_tests(), "all pass"))
    err = reference_error(device)
    rows.append(("reference", f"max |Δ| {err:.2e}", "≤ 1e-4"))
    rates = layer_rates(device, size, reps)
    port = "port not installed" if rates["port"] is None else \
        f"port {rates['port']:,.0f} tok/s, {rates['ours'] / rates['port']:.1f}×"
    rows.append(("layer", f"ours {rates['ours']:,.0f} tok/s; {port}", "≥ 20× the port"))
    # The same at 4x and 8x the batch: the same kernel launches with more work in each, so a layer
    # bound by the host (launches, syncs) gains in proportion and a GPU-bound one does not.
    for scale in (4, 8):
        b = size["batch"] * scale
        r = layer_rates(device, {**size, "batch": b}, reps)
        ratio = "" if r["port"] is None else f"; port {r['port']:,.0f} tok/s, {r['ours'] / r['port']:.1f}×"
        rows.append((f"layer×{scale}", f"B = {b}: ours {r['ours']:,.0f} tok/s{ratio}", "(diagnostic)"))
    preset, batch, seq = ("small", 2, 64) if dry_run else ("paper", 4, 2048)
    for scale in (1, 4):
        steps = step_times(device, preset, batch * scale, seq, reps)
        (fw, fw_mb), (att, att_mb) = steps["fwpkm"], steps["attention"]
        memory = "" if fw_mb is None else f"; peak {fw_mb:,.0f} / {att_mb:,.0f} MB"
        rows.append(("step" if scale == 1 else f"step×{scale}",
                     f"{preset}, B = {batch * scale}: {fw:,.1f} / {att:,.1f} ms = {fw / att:.2f}×{memory}",
                     "≤ 1.3×" if scale == 1 else "(diagnostic)"))
    batch, seq = (2, 128) if dry_run else (8, 2048)
    small = step_times(device, "small", batch, seq, reps)["fwpkm"][0]
    rows.append(("pretrain", f"small B × T = {batch} × {seq}: "
                             f"{batch * seq / small * 1e3:,.0f} tokens/s", "(recorded)"))
    width = max(len(r[1]) for r in rows)
    print(f"{'check':10s} {'result':{width}s} target")
    for check, result, target in rows:
        print(f"{check:10s} {result:{width}s} {target}")
    return 0
