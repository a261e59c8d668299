"""Optuna pruning inside a continual-learning run: stop a trial whose forgetting curves are worse
than the other trials' at the same step.

    callbacks = [CurvePruning(trial, direction="minimize")]
    execute(run_config, overrides, callbacks=callbacks)     # raises optuna.TrialPruned when pruned

What is reported: at every forgetting-curve point recorded after a training batch (every
`cl.curve_every` run steps, and once at the end of each experience), the mean over domains of
that point's loss (each domain's first `cl.curve_segments` segments of the split evaluations
read: the dev split in a sweep), keyed by the run's global step (`ContinualRunner.position.step`:
training batches since the start of the run). It is a proxy for the sweep's objective: lower is
better, so in a `maximize` study it is reported negated, and the pruner compares it at the same
step across trials. The row-0 point (step 0, before any training) is not reported: every trial
starts from the same base there.

Why not Optuna's `PyTorchLightningPruningCallback`: it reports once per epoch against Lightning's
`trainer.current_epoch`, and the runner makes a fresh Trainer with one epoch per experience (in
fast mode `trainer.global_step` also stays 0), so it would report one step again and again.

A pruned run stops mid-experience; its folder keeps the last checkpoint (resumable, incomplete).
"""

from __future__ import annotations

import warnings

import optuna

from cl_platform.callbacks import RunCallback
from cl_platform.engine import ContinualRunner


class CurvePruning(RunCallback):
    """Reports the mean curve loss at each training curve point to `trial`; raises
    `optuna.TrialPruned` when `trial.should_prune()`."""

    def __init__(self, trial: optuna.Trial, direction: str = "minimize"):
        self.trial = trial
        self.sign = -1.0 if direction == "maximize" else 1.0

    def on_curve_point(self, runner: ContinualRunner, step: int) -> None:
        if step == 0:
            return
        curves = runner.results.curves
        losses = [curves[d][-1][1] for d in runner.domains if curves.get(d)]
        mean = sum(losses) / len(losses)
        with warnings.catch_warnings():
            # A retried trial inherits what its killed predecessor reported and may reach those
            # steps again (from the last checkpoint); Optuna keeps the first value and says so.
            warnings.filterwarnings("ignore", message=".*is already reported.*")
            self.trial.report(self.sign * mean, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at run step {step}: mean curve loss {mean:.4f}")
