"""The GPU speed check (issue 52, item 4): what a short GPU window must show about FwPKM's speed.

    clp bench speed                   # on a CUDA machine, ≤ 5 minutes; JSON + table into $OUT
    clp bench speed --out DIR         # the output folder (default: $OUT, as on a lent machine)
    clp bench speed --dry-run --out DIR   # stages 2–6 on this machine's CPU at toy sizes (a test runs it)

`clp bench device` stays the acceptance table; this check looks at the speed path in stages, each
with its own time cap, each printing its lines as soon as it has them and rewriting
`gpu_speed_check.json` and `gpu_speed_check.txt` in the output folder after every stage, so a
killed run still leaves every finished stage (GPU windows are short; a timeout must not cost the
numbers already measured). A stage that raises is recorded with its error line and the next stage
runs; a stage past its cap stops (between parts, or by an alarm inside one) and keeps the
values it had.

Stages (../shared/design/GPU_PLAN.md §7), at the paper's layer size (N = 262,144, d = 768,
d_k = d_v = 512, top-8, C = 256, B × T = 4 × 2,048):
  1 env        torch / triton / CUDA versions, device name and capability
  2 syncs      host syncs of a no-grad read + write (`fwpkm_chunked`: its one end-of-call check),
               of a training forward + backward of the layer, and of `fwpkm_core` (expect 0), counted
               under `torch.cuda.set_sync_debug_mode("warn")`; then "error" mode on `fwpkm_core`;
               then CUDA-graph capture of one whole no-grad `fwpkm_core` call on static buffers, and
               its replay against an eager call on fresh inputs (within 1e-5)
  3 kernels    CUDA kernels and GPU-busy ms per no-grad call from `torch.profiler`: eager
               `fwpkm_chunked`, graph replay
  4 layer      read + write tokens/s at B = 4 and 16: the public port (when installed), the layer
               module eager (`clp bench device`'s row), the core eager, replayed, and compiled
               (`torch.compile(fwpkm_core, fullgraph=True)`, compile seconds reported)
  5 step       the `paper` preset's training step against its attention-only twin (bf16-mixed,
               median of 5), both eager, then both with the FwPKM core compiled
  6 reference  relative error ‖x − x64‖ / ‖x64‖ against float64 on the CPU: read-outs, the changes
               of the state (keys, values, read counts) and the gradients of q, v, g, for the eager
               core, the replayed graph (no gradients: a no-grad call) and the compiled core

The dry run counts syncs with `cl_platform.memory.sync_audit.SyncAudit` (the suite's counter; CPU
ops that would sync on a GPU), counts aten ops per call instead of kernels, compiles with the
"aot_eager" backend (inductor takes minutes on a CPU) and skips capture and the CUDA profiler.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from experiments.studies import bench_device

STAGES = ("env", "syncs", "kernels", "layer", "step", "reference")
# Seconds per stage (GPU_PLAN §7; the layer and reference stages hold compiles), ≤ 5 min together
# so that a 600 s device call has room for a rerun of a failed stage's fix.
CAPS = {"env": 5.0, "syncs": 30.0, "kernels": 20.0, "layer": 95.0, "step": 85.0, "reference": 45.0}
TOTAL_CAP = 280.0  # CUDA start and the stages, inside the device script's `timeout 300` (imports take the rest)
JSON_NAME, TABLE_NAME = "gpu_speed_check.json", "gpu_speed_check.txt"
REPLAY_TOL = 1e-5  # replay vs eager on the same device: the same kernels, so equal up to atomics' order
REFERENCE_BAR = 1e-4


class StageStop(Exception):
    """A stage reached its time cap; the message says where."""


class Stage:
    """One stage's record: results as they come (kept when the stage stops early), its cap and
    the part it is in (what a stop names)."""

    def __init__(self, name: str, cap: float, on_put: Callable[[Stage], None] = lambda stage: None):
        self.name, self.cap = name, cap
        self.deadline = time.monotonic() + cap
        self.part = "start"
        self.results: dict[str, Any] = {}
        self.lines: list[tuple[str, str]] = []
        self.on_put = on_put

    def begin(self, part: str) -> None:
        """Enter `part`, or stop here if the cap has passed (the parts done so far are kept)."""
        if time.monotonic() >= self.deadline:
            raise StageStop(f"cap {self.cap:g} s reached before {part}")
        self.part = part

    def put(self, key: str, value: Any, text: str | None = None) -> None:
        """Record a result and print its line now (a killed run has printed it)."""
        self.results[key] = value
        text = _show(value) if text is None else text
        self.lines.append((key, text))
        print(f"[{self.name}] {key}: {text}", flush=True)
        self.on_put(self)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_show(v)}" for k, v in value.items())
    return str(value)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip()


@contextlib.contextmanager
def _alarm(stage: Stage):
    """Stop the stage at its cap even inside one long part (a compile): SIGALRM raises StageStop
    in the main thread. Elsewhere (no SIGALRM, another thread) only the checks between parts stop it."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise StageStop(f"cap {stage.cap:g} s reached during {stage.part}")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(stage.cap, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Report:
    """The check's record in the output folder, rewritten after every stage."""

    def __init__(self, out: Path, meta: dict):
        self.out = out
        self.doc: dict[str, Any] = {**meta, "stages": {}}
        self.stages: list[Stage] = []

    def add(self, stage: Stage, status: str, seconds: float, error: str | None) -> None:
        """Record `stage` as `status` ("running" while it runs: every result is written as it comes,
        so even a kill inside a stage keeps what it had measured)."""
        if stage not in self.stages:
            self.stages.append(stage)
        self.doc["stages"][stage.name] = {"status": status, "seconds": round(seconds, 3), "cap_s": stage.cap,
                                          "error": error, "results": stage.results}
        self.write()

    def table(self) -> str:
        rows = [("stage", "status", "result")]
        for stage in self.stages:
            rec = self.doc["stages"][stage.name]
            status = f"{rec['status']} {rec['seconds']:.1f} s"
            rows.append((stage.name, status, rec["error"] or ""))
            rows += [("", "", f"{key}: {text}") for key, text in stage.lines]
        w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
        return "\n".join(f"{a:{w0}s}  {b:{w1}s}  {c}".rstrip() for a, b, c in rows) + "\n"

    def write(self) -> None:
        # Written whole and renamed, so a kill mid-write never leaves half a file.
        for name, text in ((JSON_NAME, json.dumps(self.doc, indent=1, default=str)), (TABLE_NAME, self.table())):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(self.out / name)


# --- shared measuring tools ----------------------------------------------------------------------------------


class Context:
    """What the stages share: the device, the sizes, and what one stage builds for later ones
    (the compiled core, one cache for the whole check; the captured graphs, by batch)."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.size = dict(bench_device.TOY if dry_run else bench_device.FULL)
        self.reps = 2 if dry_run else 10
        self.backend = "aot_eager" if dry_run else "inductor"
        self._compiled = None
        self.graphs: dict[int, Captured] = {}

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def compiled(self) -> Callable:
        """`fwpkm_core` under `torch.compile(fullgraph=True)`, one object so that the stages reuse
        its compiled graphs; static shapes (a second batch size compiles its own graph, not a
        dynamic one)."""
        from cl_platform.memory.fwpkm import fwpkm_core

        if self._compiled is None:
            self._compiled = torch.compile(fwpkm_core, fullgraph=True, dynamic=False, backend=self.backend)
        return self._compiled

    def config(self):
        from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule

        s = self.size
        return (FwPKMConfig(num_subkeys=s["subkeys"], d_key=s["d_key"], d_value=s["d_value"], heads=s["heads"], topk=s["topk"]),
                WriteRule(chunk=s["chunk"]))

    def inputs(self, batch: int, seed: int, device=None, grad: bool = False) -> tuple:
        """Fresh q, v (z-scored), g for one call, drawn on `device` (default: the check's): no
        host-to-device copy, which would itself be a sync inside a counted region. The reference
        stage draws them on the CPU, so that a float64 copy of the very same numbers is its input."""
        from cl_platform.memory.fwpkm import zscore

        cfg, _ = self.config()
        device = torch.device(device or self.device)
        gen = torch.Generator(device).manual_seed(seed)
        T = self.size["seq"]
        q = torch.randn(batch, T, cfg.heads * cfg.d_key, generator=gen, device=device)
        v = zscore(torch.randn(batch, T, cfg.d_value, generator=gen, device=device))
        g = torch.rand(batch, T, generator=gen, device=device)
        return tuple(t.requires_grad_(grad) for t in (q, v, g))

    def state(self, seed: int):
        """A fresh state on the device, drawn there (262,144 × 512 normals take seconds on a CPU)."""
        from cl_platform.memory.fwpkm import init_state

        cfg, _ = self.config()
        return init_state(cfg, torch.Generator(self.device).manual_seed(seed), device=self.device)

    def median_ms(self, fn: Callable[[], Any], before: Callable[[int], None] | None = None, reps: int | None = None) -> float:
        """Median ms of `fn()` after one warm-up; `before(i)`, untimed, puts run i's fresh inputs in
        place. On a GPU timed with events (the device's own clock), on the CPU with the host's."""
        reps = reps or self.reps
        if before:
            before(0)
        fn()
        times = []
        for i in range(1, reps + 1):
            if before:
                before(i)
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def _to(state, device):
    """A copy on `device`, always a copy (the call writes into it; `start` must stay as it was)."""
    from cl_platform.memory.fwpkm import FastWeightState

    return FastWeightState(*(t.to(device, copy=True) for t in state))


def _copy(state):
    from cl_platform.memory.fwpkm import FastWeightState

    return FastWeightState(*(t.detach().clone() for t in state))


class Captured:
    """One whole no-grad `fwpkm_core` call captured as a CUDA graph on static buffers: `load` copies
    fresh inputs (and a state) into them, `replay` runs the captured kernels, `out` and `state`
    are where the results land."""

    def __init__(self, q, v, g, state, cfg, rule, warmups: int = 2):
        from cl_platform.memory.fwpkm import fwpkm_core

        self.q, self.v, self.g = q.detach().clone(), v.detach().clone(), g.detach().clone()
        self.state = _copy(state)
        # PyTorch's rule for capture: warm up on a side stream first (lazy inits, allocator state
        # and library handles stay out of the graph).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(warmups):
                fwpkm_core(self.q, self.v, self.g, self.state, cfg, rule)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.out = fwpkm_core(self.q, self.v, self.g, self.state, cfg, rule)

    def load(self, q, v, g, state=None) -> None:
        with torch.no_grad():
            for static, new in zip((self.q, self.v, self.g), (q, v, g)):
                static.copy_(new)
            if state is not None:
                for static, new in zip(self.state, state):
                    static.copy_(new)

    def replay(self):
        self.graph.replay()
        return self.out


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖ in float64 on the CPU (NaN stays NaN, so it never passes a bar)."""
    x, ref = x.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


# --- the stages ------------------------------------------------------------------------------------------------


def stage_env(st: Stage, ctx: Context) -> None:
    st.put("python", platform.python_version())
    st.put("torch", torch.__version__)
    st.put("cuda", torch.version.cuda or "none")
    # "highest" means no TF32 in float32 matmuls (the reference errors assume it)
    st.put("float32_matmul_precision", torch.get_float32_matmul_precision())
    try:
        import triton

        st.put("triton", triton.__version__)
    except ImportError:
        st.put("triton", "not installed")
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        st.put("device", f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs")
        st.put("capability", f"{props.major}.{props.minor}")
    else:
        st.put("device", f"CPU (dry run), {os.cpu_count()} cores, {torch.get_num_threads()} torch threads")
    s = ctx.size
    st.put("size", f"N = {s['subkeys'] ** 2:,}, d = {s['d']}, d_k = {s['d_key']}, d_v = {s['d_value']}, "
                   f"top-{s['topk']}, C = {s['chunk']}, B × T = {s['batch']} × {s['seq']}")


def count_syncs(ctx: Context, fn: Callable[[], Any]) -> int:
    """Host syncs in `fn()`: warnings of `set_sync_debug_mode("warn")` on a GPU, the SyncAudit's
    count of ops that would sync on the CPU."""
    if not ctx.cuda:
        from cl_platform.memory.sync_audit import SyncAudit

        with SyncAudit() as audit:
            fn()
        return audit.total
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def error_mode(fn: Callable[[], Any]) -> str:
    """'raised nothing', or the first line of what `set_sync_debug_mode("error")` raised."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        return "raised nothing"
    except Exception as err:  # noqa: BLE001 - the record is the point
        return _first_line(err)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def stage_syncs(st: Stage, ctx: Context) -> None:
    from cl_platform.memory.fwpkm import fwpkm_chunked, fwpkm_core

    cfg, rule = ctx.config()
    B = ctx.size["batch"]
    state = ctx.state(1)

    # Inputs are made outside the counted calls: only the call's own syncs are counted.
    qvg, qvg_grad = ctx.inputs(B, 2), ctx.inputs(B, 3, grad=True)

    def nograd(fn):
        def call():
            with torch.no_grad():
                fn(*qvg, state, cfg, rule)
        return call

    def training(fn):
        def call():
            out = fn(*qvg_grad, state, cfg, rule)
            (out.vhat.pow(2).mean() + out.addr_loss.sum()).backward()
        return call

    layer = bench_device.make_layer(ctx.size, ctx.device)
    x = torch.randn(B, ctx.size["seq"], ctx.size["d"], device=ctx.device, requires_grad=True)

    def layer_train():
        layer.train()
        layer(x).pow(2).mean().backward()

    calls = {"chunked_nograd": nograd(fwpkm_chunked), "layer_train": layer_train,
             "core_nograd": nograd(fwpkm_core), "core_train": training(fwpkm_core)}
    for name, fn in calls.items():
        st.begin(f"syncs of {name}")
        fn()  # warm-up: first launches, library handles, allocator growth
        ctx.sync()
        st.put(f"syncs_{name}", count_syncs(ctx, fn))
    if not ctx.cuda:
        st.put("error_mode", "skipped (dry run: no sync debug mode on the CPU)")
        st.put("captured", "skipped (dry run: no CUDA graphs on the CPU)")
        return
    for name in ("core_nograd", "core_train"):
        st.begin(f"error mode on {name}")
        st.put(f"error_mode_{name}", error_mode(calls[name]))
    st.begin("capture")
    try:
        graph = Captured(*ctx.inputs(B, 4), state, cfg, rule)
    except Exception as err:  # noqa: BLE001 - captured no, and why, is the result
        st.put("captured", False)
        # The first error is the cause; ending a broken capture raises again and hides it.
        first = err
        while first.__context__ is not None:
            first = first.__context__
        st.put("capture_error", _first_line(first) + ("" if first is err else f" (then {_first_line(err)})"))
        return
    ctx.graphs[B] = graph
    st.put("captured", True)
    st.begin("replay vs eager")
    st.put("replay_vs_eager", replay_vs_eager(ctx, graph, seed=5))


def replay_vs_eager(ctx: Context, graph: Captured, seed: int) -> dict:
    """Fresh inputs and state copied into the static buffers and replayed, against an eager call
    on copies of the same: relative differences, and whether all are within REPLAY_TOL."""
    from cl_platform.memory.fwpkm import fwpkm_core

    cfg, rule = ctx.config()
    q, v, g = ctx.inputs(graph.q.shape[0], seed)
    state = ctx.state(seed + 1)
    eager_state = _copy(state)
    with torch.no_grad():
        graph.load(q, v, g, state)
        out = graph.replay()
        ref = fwpkm_core(q, v, g, eager_state, cfg, rule)
    ctx.sync()
    diffs = {"vhat": rel_err(out.vhat, ref.vhat), "idx_equal": bool(torch.equal(out.lookup.idx, ref.lookup.idx)),
             **{f: rel_err(a.float(), b.float()) for f, a, b in zip(("keys", "values", "read_counts"), graph.state, eager_state)}}
    diffs["equal"] = diffs["idx_equal"] and all(val <= REPLAY_TOL for key, val in diffs.items() if key != "idx_equal")
    return diffs


def stage_kernels(st: Stage, ctx: Context) -> None:
    from cl_platform.memory.fwpkm import fwpkm_chunked

    cfg, rule = ctx.config()
    B = ctx.size["batch"]
    state = ctx.state(6)
    q, v, g = ctx.inputs(B, 7)

    def eager():
        with torch.no_grad():
            fwpkm_chunked(q, v, g, state, cfg, rule)

    chunks = -(-ctx.size["seq"] // ctx.size["chunk"])
    if not ctx.cuda:
        # No CUDA profiler on the CPU: aten ops per call, the launch proxy of GPU_PLAN §6.4.
        from cl_platform.memory.sync_audit import SyncAudit

        st.begin("aten ops of eager fwpkm_chunked")
        eager()
        with SyncAudit() as audit:
            eager()
        st.put("eager_aten_ops_per_call", audit.ops, f"{audit.ops} ({audit.ops / chunks:.0f} per chunk of {chunks})")
        st.put("graph", "skipped (dry run: no CUDA graphs or CUDA profiler on the CPU)")
        return
    st.begin("profile eager fwpkm_chunked")
    st.put("eager", profile_kernels(eager, chunks))
    graph = ctx.graphs.get(B)
    if graph is None:
        st.put("graph", "not captured (stage syncs)")
        return
    st.begin("profile graph replay")
    graph.load(q, v, g)
    st.put("graph", profile_kernels(graph.replay, chunks))


def profile_kernels(fn: Callable[[], Any], chunks: int, calls: int = 3) -> dict:
    """Kernels (and copies / memsets) per call and GPU-busy ms per call (the union of their
    intervals) over `calls` calls under `torch.profiler`."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    copies = sum(e.name.startswith(("Memcpy", "Memset")) for e in device_events)
    spans = sorted((e.time_range.start, e.time_range.end) for e in device_events)
    busy, end = 0.0, float("-inf")
    for a, b in spans:  # union of intervals: overlapping streams are counted once
        if b > end:
            busy += b - max(a, end)
            end = b
    per_call = (len(spans) - copies) / calls
    return {"kernels_per_call": per_call, "kernels_per_chunk": per_call / chunks,
            "copies_memsets_per_call": copies / calls, "gpu_busy_ms_per_call": busy / 1e3 / calls}


def stage_layer(st: Stage, ctx: Context) -> None:
    from cl_platform.memory.fwpkm import fwpkm_chunked

    cfg, rule = ctx.config()
    T = ctx.size["seq"]
    batches = (ctx.size["batch"], 4 * ctx.size["batch"])  # 4 and 16 at full size
    sets = 3  # input sets rotated between runs: fresh numbers, not one buffer the cache holds
    rates: dict[int, dict[str, float]] = {}

    def put_rate(B: int, name: str, ms: float) -> None:
        rate = B * T / ms * 1e3
        rates.setdefault(B, {})[name] = rate
        port = rates[B].get("port")
        vs = f", {rate / port:.1f}× the port" if port and name != "port" else ""
        st.put(f"B{B}_{name}_tok_s", rate, f"{rate:,.0f} tok/s ({ms:.2f} ms){vs}")

    for B in batches:
        inputs = [ctx.inputs(B, 100 + i) for i in range(sets)]
        xs = [torch.randn(B, T, ctx.size["d"], device=ctx.device) for _ in range(sets)]
        current: dict[str, Any] = {}

        def pick(i, current=current, inputs=inputs, xs=xs):
            current["x"], current["qvg"] = xs[i % sets], inputs[i % sets]

        st.begin(f"port at B = {B}")
        port = bench_device.make_port({**ctx.size, "batch": B}, ctx.device)
        if port is None:
            st.put(f"B{B}_port", "not installed (fast-weight-product-key-memory 0.2.2)")
        else:
            def run_port(port=port, current=current):
                with torch.no_grad():
                    port(current["x"])
            put_rate(B, "port", ctx.median_ms(run_port, pick))
            del port
        st.begin(f"layer eager at B = {B}")
        torch.manual_seed(0)
        layer = bench_device.make_layer(ctx.size, ctx.device).eval()

        def run_layer(layer=layer, current=current):
            with torch.no_grad():
                layer(current["x"])
        put_rate(B, "layer_eager", ctx.median_ms(run_layer, pick))
        del layer
        st.begin(f"core eager at B = {B}")
        state = ctx.state(8)

        def run_core(state=state, current=current):
            with torch.no_grad():
                fwpkm_chunked(*current["qvg"], state, cfg, rule)
        put_rate(B, "core_eager", ctx.median_ms(run_core, pick))
        if ctx.cuda:
            st.begin(f"core graph replay at B = {B}")
            if B not in ctx.graphs:
                try:
                    ctx.graphs[B] = Captured(*inputs[0], state, cfg, rule)
                except Exception as err:  # noqa: BLE001
                    st.put(f"B{B}_core_graph", f"not captured: {_first_line(err)}")
            if B in ctx.graphs:
                graph = ctx.graphs[B]
                put_rate(B, "core_graph", ctx.median_ms(graph.replay, lambda i, graph=graph, inputs=inputs: graph.load(*inputs[i % sets])))
                if B != ctx.size["batch"]:  # later stages use only the main batch's graph: free the rest
                    del ctx.graphs[B], graph
        del state
    # Compiled last: a slow compile (stopped by the cap) leaves the other rows measured.
    compiled = ctx.compiled()
    first_compile = None
    for B in batches:
        st.begin(f"compile at B = {B}")
        left = st.deadline - time.monotonic()
        if first_compile is not None and first_compile > left:
            # A second compile would not finish inside the cap: say so, and end the stage as done.
            st.put(f"B{B}_core_compiled", f"skipped: the first compile took {first_compile:.0f} s, {left:.0f} s left of the cap")
            break
        inputs = [ctx.inputs(B, 200 + i) for i in range(sets)]
        state = ctx.state(9)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs[0], state, cfg, rule)
        ctx.sync()
        seconds = time.perf_counter() - t0
        first_compile = first_compile or seconds
        st.put(f"B{B}_compile_s", seconds, f"{seconds:.1f} s ({ctx.backend})")
        st.begin(f"core compiled at B = {B}")
        slot: dict[str, Any] = {}

        def run_compiled(state=state, slot=slot):
            with torch.no_grad():
                compiled(*slot["qvg"], state, cfg, rule)

        put_rate(B, "core_compiled", ctx.median_ms(run_compiled, lambda i, slot=slot, inputs=inputs: slot.update(qvg=inputs[i % sets])))
        del state


@contextlib.contextmanager
def compiled_core(ctx: Context):
    """Every FwPKM layer's core compiled: `fwpkm_chunked` calls the module's `fwpkm_core` by name,
    so the compiled one stands in for it inside this block (the model's code is unchanged)."""
    from cl_platform.memory import fwpkm

    original = fwpkm.fwpkm_core
    fwpkm.fwpkm_core = ctx.compiled()
    try:
        yield
    finally:
        fwpkm.fwpkm_core = original


def stage_step(st: Stage, ctx: Context) -> None:
    preset, batch, seq = ("small", 2, 64) if ctx.dry_run else ("paper", 4, 2048)
    reps = 2 if ctx.dry_run else 5
    for mode in ("eager", "compiled"):
        st.begin(f"step, {mode}")
        with compiled_core(ctx) if mode == "compiled" else contextlib.nullcontext():
            steps = bench_device.step_times(ctx.device, preset, batch, seq, reps)
        (fw, fw_mb), (att, att_mb) = steps["fwpkm"], steps["attention"]
        memory = "" if fw_mb is None else f"; peak {fw_mb:,.0f} / {att_mb:,.0f} MB"
        st.put(f"{mode}", {"fwpkm_ms": fw, "attention_ms": att, "ratio": fw / att, "fwpkm_peak_mb": fw_mb,
                           "attention_peak_mb": att_mb},
               f"{preset}, B × T = {batch} × {seq}: {fw:,.1f} / {att:,.1f} ms = {fw / att:.2f}×{memory} (target ≤ 1.3×)")


def stage_reference(st: Stage, ctx: Context) -> None:
    from cl_platform.memory.fwpkm import fwpkm_core

    cfg, rule = ctx.config()
    # The main batch: the shape of the graph captured in stage syncs and of the training graph
    # compiled in stage step, so neither is built again here.
    B = ctx.size["batch"]
    q, v, g = ctx.inputs(B, 11, device="cpu")
    start = ctx.state(12)  # drawn on the device (fast); the reference starts from a copy of it
    start_cpu = _to(start, "cpu")

    def run(fn, state, grad: bool, device):
        q_, v_, g_ = (t.detach().to(device, state.values.dtype, copy=True).requires_grad_(grad) for t in (q, v, g))
        with torch.set_grad_enabled(grad):
            out = fn(q_, v_, g_, state, cfg, rule)
            grads = None
            if grad:
                w = torch.linspace(-1, 1, out.vhat.numel(), dtype=out.vhat.dtype, device=out.vhat.device).view_as(out.vhat)
                grads = torch.autograd.grad((out.vhat * w).sum() + out.addr_loss.sum(), (q_, v_, g_))
        return out.vhat.detach(), state, grads

    st.begin("float64 reference on the CPU")
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or threads)  # the device waits meanwhile: use every core
    try:
        ref_vhat, ref_state, ref_grads = run(fwpkm_core, _cast(start_cpu, torch.float64), True, "cpu")
    finally:
        torch.set_num_threads(threads)
    # Writes touch only rows read in the call: compare the change there (the whole 262,144-row
    # table would take seconds to convert, and its untouched rows would dilute the error).
    rows = (ref_state.read_counts != start_cpu.read_counts).nonzero().squeeze(1)
    st.put("rows_touched", int(rows.numel()))

    def errors(vhat, state, grads) -> dict:
        e = {"vhat": rel_err(vhat, ref_vhat),
             "keys": rel_err(state.keys.to("cpu", torch.float64) - start_cpu.keys.double(),
                             ref_state.keys - start_cpu.keys.double()),
             "values": rel_err(state.values[rows.to(state.values.device)].to("cpu", torch.float64) - start_cpu.values[rows].double(),
                               ref_state.values[rows] - start_cpu.values[rows].double()),
             "read_counts": rel_err(state.read_counts.cpu() - start_cpu.read_counts, ref_state.read_counts - start_cpu.read_counts)}
        if grads is not None:
            e.update({f"d{n}": rel_err(a, b) for n, a, b in zip("qvg", grads, ref_grads)})
        e["max"] = max(e.values())
        return e

    def put(path: str, e: dict) -> None:
        st.put(path, e, f"{_show(e)}: {'within' if e['max'] <= REFERENCE_BAR else 'OUTSIDE'} the {REFERENCE_BAR:g} bar")

    st.begin("eager")
    put("eager", errors(*run(fwpkm_core, _copy(start), True, ctx.device)))
    if ctx.cuda:
        st.begin("graph replay")
        graph = ctx.graphs.get(B)
        if graph is None:
            st.put("graph", "not captured (stage syncs)")
        else:
            with torch.no_grad():
                graph.load(*(t.to(ctx.device) for t in (q, v, g)), start)
                out = graph.replay()
            put("graph", errors(out.vhat, graph.state, None))
    else:
        st.put("graph", "skipped (dry run: no CUDA graphs on the CPU)")
    st.begin("compiled")
    put("compiled", errors(*run(ctx.compiled(), _copy(start), True, ctx.device)))


def _cast(state, dtype):
    """Keys and values in `dtype` (counts and mask keep theirs)."""
    return state._replace(keys=state.keys.to(dtype), values=state.values.to(dtype),
                          read_counts=state.read_counts.clone(), write_mask=state.write_mask.clone())


STAGE_FUNCTIONS = {"env": stage_env, "syncs": stage_syncs, "kernels": stage_kernels, "layer": stage_layer,
                   "step": stage_step, "reference": stage_reference}


# --- the command ------------------------------------------------------------------------------------------------


def main(dry_run: bool = False, out: str | None = None, caps: dict[str, float] | None = None,
         fail: str | None = None) -> int:
    """Run the stages in order into the output folder (`out`, else $OUT). `caps` overrides stage
    time caps (seconds); `fail` names a stage made to raise at its start (how the suite shows that
    a failed stage is recorded and the next ones still run)."""
    from cl_platform.check import ConfigError

    folder = out or os.environ.get("OUT")
    if not folder:
        raise ConfigError("clp bench speed: no output folder; give --out DIR (or set $OUT)")
    folder_path = Path(folder)
    if folder_path.exists() and not folder_path.is_dir():
        raise ConfigError(f"clp bench speed: --out {folder} is a file, not a folder")
    caps = {**CAPS, **(caps or {})}
    unknown = sorted(set(caps) - set(STAGES))
    if unknown:
        raise ConfigError(f"clp bench speed: unknown stage(s) {unknown} in caps; stages are {list(STAGES)}")
    bad = sorted(k for k, c in caps.items() if not (isinstance(c, (int, float)) and c > 0))
    if bad:
        raise ConfigError(f"clp bench speed: the cap of {bad} must be a number of seconds > 0")
    if fail is not None and fail not in STAGES:
        raise ConfigError(f"clp bench speed: fail={fail!r} is not a stage; stages are {list(STAGES)}")
    if not dry_run and not torch.cuda.is_available():
        raise ConfigError("clp bench speed: torch sees no CUDA device on this machine; "
                          "--dry-run runs stages 2–6 on the CPU at toy sizes")
    folder_path.mkdir(parents=True, exist_ok=True)
    ctx = Context(dry_run)
    report = Report(folder_path, {"check": "gpu speed (issue 52 item 4)", "dry_run": dry_run,
                                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "size": ctx.size,
                                  "caps_s": caps, "total_cap_s": TOTAL_CAP})
    t_start = time.monotonic()
    if ctx.cuda:  # CUDA's start-up (seconds) belongs to no stage's cap
        torch.zeros(1, device=ctx.device)
        torch.cuda.synchronize()
        print(f"CUDA ready in {time.monotonic() - t_start:.1f} s", flush=True)
    for name in STAGES:
        left = TOTAL_CAP - (time.monotonic() - t_start)
        t0 = time.monotonic()
        stage = Stage(name, min(caps[name], max(left, 0.0)),
                      on_put=lambda st, t0=t0: report.add(st, "running", time.monotonic() - t0, None))
        status, error = "ok", None
        try:
            if left <= 0:
                raise StageStop(f"the check's total cap of {TOTAL_CAP:g} s was spent before this stage")
            with _alarm(stage):
                if fail == name:
                    raise RuntimeError(f"this stage was made to fail (fail={name!r})")
                STAGE_FUNCTIONS[name](stage, ctx)
                ctx.sync()
        except StageStop as stop:
            status, error = "capped", str(stop)
        except Exception as err:  # noqa: BLE001 - one stage's failure must not cost the others' numbers
            status, error = "error", _first_line(err)
            if time.monotonic() >= stage.deadline:  # the alarm's StageStop, wrapped by the code it hit (a compile)
                status, error = "capped", f"cap {stage.cap:g} s reached during {stage.part} ({error})"
        finally:
            if ctx.cuda:
                torch.cuda.set_sync_debug_mode("default")
        seconds = time.monotonic() - t0
        print(f"[{name}] {status} in {seconds:.1f} s" + (f": {error}" if error else ""), flush=True)
        report.add(stage, status, seconds, error)
    print(report.table(), end="", flush=True)
    print(f"written: {folder_path / JSON_NAME}, {folder_path / TABLE_NAME}", flush=True)
    return 0
