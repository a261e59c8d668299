"""Step benchmark: what one training step and one evaluation forward of the main job's model
cost in each precision, printed as the table kept in BENCHMARKS.md.

    clp bench step               # small preset, B = 8, T = 512, float32 vs bf16-mixed
    clp bench step --quick       # fewer repeats (smoke run)
    clp bench step --variants    # the baseline family (issue 8): attention only, + PKM, + FwPKM, + both
    clp bench step --seq-len 2048   # the reference bases' segments (issue 22); B = 8 either way

It runs the LMModule's own code paths outside Lightning: `training_step`'s forward through the
writes, backward, clipping and the MixedAdamW step (phase `pretrain`); the evaluation forward with
writes off; the fast-mode forward with writes on. Precisions alternate step by step, so machine
noise falls on both; the table gives medians.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import torch

BATCH, SEQ, VOCAB = 8, 512, 4096


# The baseline family of issue 8 on the small preset: which layers hold which memory.
VARIANTS = {
    "attention only": dict(fwpkm_layers=[], pkm_layers=[]),
    "+ PKM (layer 2)": dict(fwpkm_layers=[], pkm_layers=[2]),
    "+ FwPKM (layers 1, 3)": dict(fwpkm_layers=[1, 3], pkm_layers=[]),
    "+ both": dict(fwpkm_layers=[1, 3], pkm_layers=[2]),
}


EQUAL = "attention, equal active"  # attention only, MLPs widened to the FwPKM model's active parameters


def equal_active_mlp_ratio() -> float:
    """The MLP ratio at which the attention-only small model has the active parameters of the
    FwPKM one (the issue's comparison: time per token at equal active parameters)."""
    from cl_platform.model import FwPKMLM, ModelConfig, count_parameters

    def active(**layers) -> int:
        config = dataclasses.replace(ModelConfig.from_preset("small"), vocab_size=VOCAB, **layers)
        return count_parameters(FwPKMLM(config))["active"]

    base, target = active(**VARIANTS["attention only"]), active(**VARIANTS["+ FwPKM (layers 1, 3)"])
    small = ModelConfig.from_preset("small")
    per_ratio = active(**VARIANTS["attention only"], mlp_ratio=small.mlp_ratio + 1.0) - base  # params per unit of ratio
    return small.mlp_ratio + (target - base) / per_ratio


def _module(precision: str, layers: dict | None = None):
    from cl_platform.lm_module import LMModule, OptimSettings
    from cl_platform.memory.fwpkm import WriteRule
    from cl_platform.model import FwPKMLM, ModelConfig

    torch.manual_seed(0)
    config = dataclasses.replace(ModelConfig.from_preset("small"), vocab_size=VOCAB, **(layers or {}))
    model = FwPKMLM(config, WriteRule(lr_values=1.0, chunk=128))
    return LMModule(model, phase="pretrain", optim=OptimSettings(lr=1.5e-3), precision=precision)


def _train_step(m, opt, x, y) -> None:
    """One training step as LMModule takes it: forward through the writes, backward, clip, AdamW."""
    m.model.train()
    with m.autocast():
        _, loss = m.model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    # Sparse gradients (a static PKM's value rows) are left out of clipping, as LMModule does.
    torch.nn.utils.clip_grad_norm_([q for q in m.model.parameters() if q.grad is not None and not q.grad.is_sparse], 1.0)
    opt.step()


def _fast_forward(m, x, y) -> None:
    """One fast-mode step: forward with writes, no graph."""
    m.model.eval()
    with torch.no_grad(), m.autocast():
        m.model(x, y)


def main(quick: bool = False, threads: int | None = None, variants: bool = False, seq_len: int = SEQ) -> int:
    from cl_platform.optim import MixedAdamW

    if threads:
        torch.set_num_threads(threads)
    if variants:
        return _variants(quick, seq_len)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, seq_len + 1), generator=g)
    batch = {"input_ids": tokens[:, :-1], "targets": tokens[:, 1:]}
    modules = {p: _module(p) for p in ("32-true", "bf16-mixed")}
    optims = {p: MixedAdamW(m.model.optimizer_groups(0.1, 1.5e-3)) for p, m in modules.items()}

    def train(p):
        _train_step(modules[p], optims[p], batch["input_ids"], batch["targets"])

    def evaluate(p):
        m = modules[p]
        m.model.eval()
        m.model.set_writes(False)
        with torch.no_grad():
            m.token_loss_sum(batch)
        m.model.set_writes(True)

    def fast(p):
        _fast_forward(modules[p], batch["input_ids"], batch["targets"])

    reps = 3 if quick else 8
    print(f"small preset, B = {BATCH}, T = {seq_len}, vocabulary {VOCAB}, {torch.get_num_threads()} threads; "
          f"median of {reps} (after 2 warm-up steps)")
    print(f"{'':34s} {'32-true':>10s} {'bf16-mixed':>11s} {'speed-up':>9s} {'tokens/s 32 / bf16':>20s}")
    for name, fn in (("training step through the writes", train), ("evaluation forward, writes off", evaluate),
                     ("fast-mode forward, writes on", fast)):
        times = {p: [] for p in modules}
        for r in range(reps + 2):
            for p in (modules if r % 2 == 0 else list(modules)[::-1]):
                t0 = time.perf_counter()
                fn(p)
                if r >= 2:
                    times[p].append(time.perf_counter() - t0)
        a, b = (statistics.median(times[p]) * 1e3 for p in ("32-true", "bf16-mixed"))
        tokens = BATCH * seq_len  # a and b are ms
        print(f"{name:34s} {a:8.0f} ms {b:8.0f} ms {a / b:8.2f}x {tokens / a * 1e3:10,.0f} / {tokens / b * 1e3:,.0f}")
    return 0


def _variants(quick: bool, seq_len: int) -> int:
    """Tokens/s of each variant's training step and fast-mode forward, in both precisions."""
    from cl_platform.model import count_parameters
    from cl_platform.optim import MixedAdamW

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, seq_len + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    reps = 2 if quick else 5
    print(f"small preset, B = {BATCH}, T = {seq_len}, {torch.get_num_threads()} threads; tokens/s, median of {reps} "
          f"(after 1 warm-up step); ratio = attention-only tokens/s / the variant's")
    print(f"{'variant':24s} {'active params':>14s} {'precision':>11s} {'train tok/s':>12s} {'ratio':>6s} "
          f"{'fast tok/s':>11s} {'ratio':>6s}")
    reference: dict[str, tuple[float, float]] = {}
    measured: dict[tuple[str, str], list[float]] = {}
    ratio = equal_active_mlp_ratio()
    family = {**VARIANTS, EQUAL: dict(fwpkm_layers=[], pkm_layers=[], mlp_ratio=ratio)}
    for name, layers in family.items():
        for precision in ("32-true", "bf16-mixed"):
            m = _module(precision, layers)
            opt = MixedAdamW(m.model.optimizer_groups(0.1, 1.5e-3))

            rates = []
            for fn in (lambda: _train_step(m, opt, x, y), lambda: _fast_forward(m, x, y)):
                fn()
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                rates.append(BATCH * seq_len / statistics.median(times))
            reference.setdefault(precision, tuple(rates))
            measured[(name, precision)] = rates
            ref = reference[precision]
            active = count_parameters(m.model)["active"]
            print(f"{name:24s} {active / 1e6:12.2f} M {precision:>11s} {rates[0]:12,.0f} {ref[0] / rates[0]:5.2f}x "
                  f"{rates[1]:11,.0f} {ref[1] / rates[1]:5.2f}x", flush=True)
    print(f"\nFwPKM model's time per token / attention-only's at equal active parameters (MLP ratio {ratio:.2f}):")
    for precision in ("32-true", "bf16-mixed"):
        eq, fw = measured[(EQUAL, precision)], measured[("+ FwPKM (layers 1, 3)", precision)]
        print(f"  {precision:>10s}: training {eq[0] / fw[0]:.2f}x, fast forward (read + write) {eq[1] / fw[1]:.2f}x")
    return 0
