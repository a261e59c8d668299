"""FwPKM layer benchmark: tokens/s and peak memory, printed as the table kept in BENCHMARKS.md.

    clp bench layer              # full table (a few minutes on 2 cores)
    clp bench layer --quick      # two sizes, short repeats

Configuration (the speed and memory targets of BENCHMARKS.md): d = 256, d_k = d_v = 256, top-8, 1 head, C = 256, B = 2,
T = 1024, N = S² slots. Rows:
  (a) `nograd`: read + write without a graph (adaptation / evaluation mode);
  (b) `train`: forward with differentiable writes, backward into the slow weights;
  the loop reference (`fwpkm_naive`) at the smallest N on a shorter input;
  a dense MLP block with the FwPKM layer's active parameters.
Each row runs in a fresh subprocess so its peak RSS (minus the RSS before the layer was built)
is its own.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

D, DK, DV, TOPK, CHUNK, B, T = 256, 256, 256, 8, 256, 2, 1024
SIZES = {16_384: 128, 65_536: 256, 262_144: 512, 1_048_576: 1024}


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _time(fn, min_iters: int, min_seconds: float) -> float:
    fn()  # warm-up (allocator, first-touch)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _worker(spec: dict) -> dict:
    import torch
    from torch import nn

    from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule, zscore
    from cl_platform.memory.fwpkm_naive import naive_fwpkm

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    base = _rss_mb()
    kind, S = spec["kind"], spec["S"]
    iters, secs = spec["iters"], spec["seconds"]
    cfg = FwPKMConfig(num_subkeys=S, d_key=DK, d_value=DV, topk=TOPK)
    rule = WriteRule(chunk=CHUNK)
    bt = (B, T)
    if kind == "naive":
        bt = (1, CHUNK)  # loop-based: one chunk of one sequence is already slow
        layer = FwPKM(D, cfg, rule)
        x = torch.randn(*bt, D)
        q = layer.proj_q(layer.norm_q(x)).detach()
        v = zscore(layer.proj_v(layer.norm_v(x))).detach()
        g = torch.sigmoid(layer.proj_g(layer.norm_g(x))).squeeze(-1).detach()
        state = layer.snapshot()
        step = lambda: naive_fwpkm(q, v, g, state, cfg, rule)  # noqa: E731
    elif kind == "mlp":
        layer = FwPKM(D, cfg, rule)
        slow = sum(p.numel() for p in layer.parameters())
        active = slow + TOPK * DV + 2 * S * DK // 2  # read rows + every sub-key is scored
        hidden = max(1, round(active / (2 * D)))
        mlp = nn.Sequential(nn.Linear(D, hidden), nn.GELU(), nn.Linear(hidden, D))
        del layer
        x = torch.randn(*bt, D, requires_grad=spec["train"])
        if spec["train"]:
            step = lambda: mlp(x).pow(2).mean().backward()  # noqa: E731
        else:
            step = lambda: mlp(x)  # noqa: E731
        spec["hidden"] = hidden
    else:
        layer = FwPKM(D, cfg, rule)
        x = torch.randn(*bt, D, requires_grad=spec["train"])
        if spec["train"]:
            step = lambda: layer(x).pow(2).mean().backward()  # noqa: E731
        else:
            step = lambda: layer(x)  # noqa: E731
    ctx = torch.enable_grad() if spec["train"] or kind == "naive" else torch.no_grad()
    with ctx:
        sec = _time(step, iters, secs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**spec, "tokens": bt[0] * bt[1], "tok_s": bt[0] * bt[1] / sec, "sec": sec,
            "peak_mb": peak - base, "table_mb": S * S * DV * 4 / 2**20}


def _run(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "experiments.studies.bench_layer", "--worker", json.dumps(spec)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(quick: bool = False, threads: int | None = None) -> int:
    import torch

    sizes = list(SIZES.items())[:2] if quick else list(SIZES.items())
    iters, secs = (2, 0.5) if quick else (3, 2.0)
    specs = []
    for N, S in sizes:
        for train in (False, True):
            specs.append({"kind": "fwpkm", "S": S, "N": N, "train": train})
    specs.append({"kind": "naive", "S": sizes[0][1], "N": sizes[0][0], "train": False})
    for train in (False, True):
        specs.append({"kind": "mlp", "S": 256, "N": 65_536, "train": train})
    print(f"FwPKM layer benchmark: d={D} d_k=d_v={DK} top-{TOPK} heads=1 C={CHUNK} B={B} T={T}; "
          f"torch {torch.__version__}, threads={threads or torch.get_num_threads()}")
    header = f"{'layer':<22}{'N':>10}{'mode':>8}{'tokens/s':>12}{'ms/step':>10}{'peak MB':>10}{'table MB':>10}"
    print(header)
    print("-" * len(header))
    rows = []
    for spec in specs:
        r = _run({**spec, "iters": iters if spec["kind"] != "naive" else 1,
                  "seconds": secs if spec["kind"] != "naive" else 0.0, "threads": threads})
        rows.append(r)
        name = {"fwpkm": "FwPKM", "naive": "FwPKM naive (1×256)", "mlp": f"dense MLP h={r.get('hidden')}"}[r["kind"]]
        print(f"{name:<22}{r['N']:>10,}{'train' if r['train'] else 'nograd':>8}{r['tok_s']:>12,.0f}"
              f"{r['sec'] * 1e3:>10.1f}{r['peak_mb']:>10.0f}{r['table_mb'] if r['kind'] == 'fwpkm' else 0:>10.0f}")
    by = {(r["kind"], r["N"], r["train"]): r for r in rows}
    if not quick:
        for train in (False, True):
            a, b = by[("fwpkm", 65_536, train)], by[("fwpkm", 1_048_576, train)]
            print(f"time/token growth 65,536 → 1,048,576 ({'train' if train else 'nograd'}): "
                  f"{b['sec'] / a['sec']:.2f}× (target ≤ 2.5×)")
        big = by[("fwpkm", 1_048_576, False)]
        print(f"peak memory without graph at N=1,048,576: {big['peak_mb']:.0f} MB "
              f"(target < 1.5 × {big['table_mb']:.0f} + 300 = {1.5 * big['table_mb'] + 300:.0f} MB)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(json.loads(sys.argv[2]))))
    else:
        sys.exit(main(quick="--quick" in sys.argv))
