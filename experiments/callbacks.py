"""What `clp run` reports while a run goes: run callbacks (`cl_platform.engine.RunCallback`) that
print, plot and summarise; they live in the composition root because they use `analysis`.

    ExperienceSummary  one printed line per results row
    ResultsHeatmap     the results matrix as a TensorBoard image after every row (analysis.plots)
    HparamsSummary     TensorBoard's hparams view at the end: settings against headline metrics
"""

from __future__ import annotations

import math
import sys
import time

from analysis.metrics import METRICS, summary
from analysis.plots import heatmap_figure
from cl_platform.callbacks import RunCallback
from cl_platform.engine import ContinualRunner


class ExperienceSummary(RunCallback):
    """One printed line per results row: the experience, its steps, time, mean training loss and
    every domain's evaluation loss (`*` = the domain it trained)."""

    def __init__(self, stream=sys.stdout):
        self.out = stream
        self._losses: list[float] = []
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._losses.append(pl_module.last_losses.get("lm", math.nan))

    def on_results_row(self, runner: ContinualRunner, row: int) -> None:
        matrix = runner.results.matrix
        trained = matrix.trained_domain(row) if row else None
        cells = "  ".join(
            f"{d} {v:.3f}{'*' if d == trained else ''}" for d, v in zip(matrix.domains, matrix.values[row])
        )
        mean = sum(matrix.values[row]) / len(matrix.domains)
        head = "[0 before]" if row == 0 else f"[{row}/{matrix.num_experiences} {trained}]"
        train = ""
        if self._losses:
            train = f" {len(self._losses)} steps, train loss {sum(self._losses) / len(self._losses):.3f} |"
        took = time.perf_counter() - self._start
        print(f"{head}{train} eval loss {cells} | mean {mean:.3f} (ppl {math.exp(mean):.1f}) | {took:.1f} s",
              file=self.out, flush=True)
        self._losses = []
        self._start = time.perf_counter()


class ResultsHeatmap(RunCallback):
    """The results matrix as an image (`results/matrix`) after every row, at the run's step."""

    def on_results_row(self, runner: ContinualRunner, row: int) -> None:
        experiment = getattr(runner.logger, "experiment", None)
        if not hasattr(experiment, "add_figure"):  # not rank zero
            return
        experiment.add_figure("results/matrix", heatmap_figure(runner.results.matrix), global_step=runner.position.step)


class HparamsSummary(RunCallback):
    """The run's settings (write rule included) against its headline metrics, in the HPARAMS tab."""

    def on_run_end(self, runner: ContinualRunner) -> None:
        cfg = runner.config
        params = {
            "mode": cfg.cl.mode,
            "eval_memory": cfg.cl.eval_memory,
            "strategy": cfg.strategy_name,
            "seed": cfg.seed,
            "batch_size": cfg.cl.batch_size,
            "lr": cfg.cl.lr if cfg.cl.mode == "finetune" else 0.0,
            "model": cfg.model.preset,
            "fwpkm.lr_values": cfg.cl.fwpkm.lr_values,
            "fwpkm.lr_keys": cfg.cl.fwpkm.lr_keys,
            "fwpkm.addr_weight": cfg.cl.fwpkm.addr_weight,
            "fwpkm.chunk": cfg.cl.fwpkm.chunk,
            "experiences": " -> ".join(runner.results.matrix.experiences),
            "config_hash": runner.results.config_hash[:12],
        }
        # One strategy's arguments as `strategy.<arg>`; a composed list's as `strategy[i].<arg>`.
        params.update({f"{where}.{k}": v for where, s in cfg.strategy_fields for k, v in s.kwargs.items()
                       if isinstance(v, (int, float, str, bool))})
        # The registry's metrics (analysis.metrics.METRICS) in summary order, the finite ones.
        s = summary(runner.results)
        metrics = {f"final/{name}": s[name] for name in METRICS
                   if isinstance(s.get(name), float) and math.isfinite(s[name])}
        runner.logger.log_hyperparams(params, metrics=metrics, step=runner.position.step)


def default_callbacks() -> list[RunCallback]:
    """What `clp run` attaches: a line per experience, the matrix heatmap, the hparams summary."""
    return [ExperienceSummary(), ResultsHeatmap(), HparamsSummary()]
