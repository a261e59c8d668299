"""Lightning callbacks for logging and progress, shared by pretraining and the continual runner,
and `RunCallback`, the observer of a continual run (results rows, curve points, the end). What
changes the loss is a strategy (cl_platform/strategy.py); what only watches is a callback, here.

Everything is logged against the run's own step (`LMModule.position.step`: training batches so far
over the whole run), never Lightning's `global_step`, which counts optimiser steps (none in fast
mode) and restarts with every fresh Trainer.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


def log_scalars(logger: Any, metrics: dict[str, float], step: int) -> None:
    """Log finite scalars to a Lightning logger (or each of a list) at an explicit step."""
    finite = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    loggers = logger if isinstance(logger, (list, tuple)) else [logger]
    for lg in loggers:
        if lg is not None and finite:
            lg.log_metrics(finite, step=step)


def mark_restart(logger: Any, step: int) -> None:
    """Tell TensorBoard the run restarted from a checkpoint taken at `step`: points logged after
    `step` before the restart (after the checkpoint, before the kill) are discarded when the logs
    are read, so a resumed run's curves have no duplicate tail. Everything logged at `step` itself
    precedes the checkpoint and is kept."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    experiment = getattr(logger, "experiment", None)
    get_writer = getattr(experiment, "_get_file_writer", None)
    writer = get_writer() if get_writer is not None else None
    if writer is None:  # not TensorBoard, or not rank zero (Lightning's dummy experiment answers None)
        return
    writer.add_event(Event(step=step + 1, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))


class TrainingLogger(L.Callback):
    """Every `every` steps: the loss terms (`<prefix>/lm`, strategy terms by name, `total`, `lr`,
    `grad_norm`) and, per FwPKM layer, gate mean, write magnitudes and addressing health."""

    def __init__(self, every: int = 1, prefix: str = "train"):
        self.every = every
        self.prefix = prefix

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.position.step
        if step % self.every:
            return
        metrics = {f"{self.prefix}/{name}": value for name, value in pl_module.last_losses.items()}
        metrics.update({f"fwpkm/{name}": value for name, value in pl_module.fwpkm_stats().items()})
        log_scalars(trainer.loggers, metrics, step)


class ExperienceProgressBar(TQDMProgressBar):
    """Lightning's bar, labelled with the experience (or phase) instead of the epoch number."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self.train_progress_bar.set_description(pl_module.progress_label)

    def get_metrics(self, trainer, pl_module) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


class ProgressLines(L.Callback):
    """Progress for a log file (stdout not a terminal, where a bar's carriage returns make one
    endless line): a plain line at every tenth of a fit's batches, at least every `seconds`, and at
    its last batch, e.g. `exp 2/4 law: 120/600 batches (20%), step 720, loss 3.412, 41 s`."""

    def __init__(self, seconds: float = 30.0):
        self.seconds = seconds

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = self._last = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero:  # one process prints, as the bar does
            return
        done, total = batch_idx + 1, trainer.num_training_batches
        now = time.monotonic()
        finite = isinstance(total, int)
        tenth = finite and done * 10 // total > batch_idx * 10 // total
        if not (tenth or done == total or now - self._last >= self.seconds):
            return
        self._last = now
        count = f"{done}/{total} batches ({done / total:.0%})" if finite else f"{done} batches"
        loss = pl_module.last_losses.get("lm", math.nan)
        print(f"{pl_module.progress_label}: {count}, step {pl_module.position.step}, loss {loss:.3f}, "
              f"{now - self._start:.0f} s", flush=True)


class RunCallback(L.Callback):
    """A Lightning callback that also hears about results rows and the end of the run (`runner`:
    the `cl_platform.engine.ContinualRunner`, named as a string: the engine imports this module)."""

    def on_results_row(self, runner: "ContinualRunner", row: int) -> None:
        """Row `row` of `runner.results.matrix` has just been measured (0 = before any experience)."""

    def on_curve_point(self, runner: "ContinualRunner", step: int) -> None:
        """Forgetting-curve point `step` has just been added to `runner.results.curves` (every
        domain) and written to results.json. Called inside the training loop when the point is
        due after a batch, so an exception raised here stops the run there (Optuna pruning:
        experiments/multi/sweep_pruning.py); the run's checkpoint stays resumable."""

    def on_checkpoint(self, runner: "ContinualRunner", path: Path) -> None:
        """The resumable checkpoint `path` has just been written, complete, at run step
        `runner.position.step` (a sweep uploads it: experiments/multi/sweep_artifacts.py)."""

    def on_run_end(self, runner: "ContinualRunner") -> None:
        """Every row is measured and results.json is final."""
