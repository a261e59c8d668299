"""Step benchmark: what one training step and one evaluation forward of the main job's model
cost in each precision, printed as the table kept in BENCHMARKS.md.

    clp bench step               # small preset, B = 8, T = 512, float32 vs bf16-mixed
    clp bench step --quick       # fewer repeats (smoke run)

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


def _module(precision: str):
    from cl_platform.fwpkm import WriteRule
    from cl_platform.lm_module import LMModule, OptimSettings
    from cl_platform.model import FwPKMLM, ModelConfig

    torch.manual_seed(0)
    config = dataclasses.replace(ModelConfig.from_preset("small"), vocab_size=VOCAB)
    model = FwPKMLM(config, WriteRule(lr_values=1.0, chunk=128))
    return LMModule(model, phase="pretrain", optim=OptimSettings(lr=1.5e-3), precision=precision)


def main(quick: bool = False, threads: int | None = None) -> int:
    from cl_platform.optim import MixedAdamW

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    batch = {"input_ids": tokens[:, :-1], "targets": tokens[:, 1:]}
    modules = {p: _module(p) for p in ("32-true", "bf16-mixed")}
    optims = {p: MixedAdamW(m.model.optimizer_groups(0.1, 1.5e-3)) for p, m in modules.items()}

    def train(p):
        m, opt = modules[p], optims[p]
        m.model.train()
        with m.autocast():
            _, loss = m.model(batch["input_ids"], batch["targets"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([q for q in m.model.parameters() if q.grad is not None], 1.0)
        opt.step()

    def evaluate(p):
        m = modules[p]
        m.model.eval()
        m.model.set_writes(False)
        with torch.no_grad():
            m.token_loss_sum(batch)
        m.model.set_writes(True)

    def fast(p):
        m = modules[p]
        m.model.eval()
        with torch.no_grad(), m.autocast():
            m.model(batch["input_ids"], batch["targets"])

    reps = 3 if quick else 8
    print(f"small preset, B = {BATCH}, T = {SEQ}, vocabulary {VOCAB}, {torch.get_num_threads()} threads; "
          f"median of {reps} (after 2 warm-up steps)")
    print(f"{'':34s} {'32-true':>10s} {'bf16-mixed':>11s} {'speed-up':>9s}")
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
        print(f"{name:34s} {a:8.0f} ms {b:8.0f} ms {a / b:8.2f}x")
    return 0
