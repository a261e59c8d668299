"""Run callbacks that need the analysis package (the composition root may import it).

`HparamsSummary` writes TensorBoard's hparams view at the end of a run: the run's settings
against its headline metrics (`analysis.metrics.summary` of the results matrix).
"""

from __future__ import annotations

import math

from analysis.metrics import summary
from cl_platform.callbacks import ExperienceSummary, ResultsHeatmap, RunCallback


class HparamsSummary(RunCallback):
    def on_run_end(self, runner) -> None:
        cfg = runner.config
        params = {
            "mode": cfg.cl.mode,
            "eval_memory": cfg.cl.eval_memory,
            "strategy": cfg.strategy.name,
            "seed": cfg.seed,
            "batch_size": cfg.cl.batch_size,
            "lr": cfg.cl.lr if cfg.cl.mode == "finetune" else 0.0,
            "model": cfg.model.get("preset", "small"),
            "experiences": " -> ".join(runner.results.matrix.experiences),
            "config_hash": runner.results.config_hash[:12],
            **{f"strategy.{k}": v for k, v in cfg.strategy.kwargs.items() if isinstance(v, (int, float, str, bool))},
        }
        metrics = {
            f"final/{key}": value
            for key, value in summary(runner.results).items()
            if isinstance(value, float) and math.isfinite(value)
        }
        runner.logger.log_hyperparams(params, metrics=metrics, step=runner.module.step)


def default_callbacks() -> list[RunCallback]:
    """What `clp run` attaches: a line per experience, the matrix heatmap, the hparams summary."""
    return [ExperienceSummary(), ResultsHeatmap(), HparamsSummary()]
