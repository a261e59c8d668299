"""Lightning callbacks for logging and progress, plus the two run-level hooks the runner adds.

Everything is logged against the run's own step (`LMModule.step`: training batches so far over
the whole run), never Lightning's `global_step`, which counts optimiser steps (none in fast mode)
and restarts with every fresh Trainer.

`RunCallback` is a Lightning `Callback` with two more hooks that `ContinualRunner` calls between
Trainers: `on_results_row` after row t of the results matrix is measured, and `on_run_end`.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

if TYPE_CHECKING:
    from cl_platform.engine import ContinualRunner


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
    if get_writer is None:  # not rank zero, or not TensorBoard
        return
    get_writer().add_event(Event(step=step + 1, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START)))


class RunCallback(L.Callback):
    """A Lightning callback that also hears about results rows and the end of the run."""

    def on_results_row(self, runner: "ContinualRunner", row: int) -> None:
        """Row `row` of `runner.results.matrix` has just been measured (0 = before any experience)."""

    def on_run_end(self, runner: "ContinualRunner") -> None:
        """Every row is measured and results.json is final."""


class TrainingLogger(L.Callback):
    """Every `every` steps: the loss terms (`<prefix>/lm`, strategy terms by name, `total`, `lr`,
    `grad_norm`) and, per FwPKM layer, gate mean, write magnitudes and addressing health."""

    def __init__(self, every: int = 1, prefix: str = "train"):
        self.every = every
        self.prefix = prefix

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.step
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


class ExperienceSummary(RunCallback):
    """One printed line per results row: the experience, its steps, time, mean training loss and
    every domain's evaluation loss (`*` = the domain it trained)."""

    def __init__(self, stream=sys.stdout):
        self.out = stream
        self._losses: list[float] = []
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._losses.append(pl_module.last_losses.get("lm", math.nan))

    def on_results_row(self, runner: "ContinualRunner", row: int) -> None:
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

    def on_results_row(self, runner: "ContinualRunner", row: int) -> None:
        experiment = getattr(runner.logger, "experiment", None)
        if not hasattr(experiment, "add_figure"):  # not rank zero
            return
        experiment.add_figure("results/matrix", heatmap_figure(runner.results.matrix), global_step=runner.module.step)


def heatmap_figure(matrix):
    """Two panels: R[t, j] as measured, and R[t, j] − R[0, j] (change since before the stream).

    The domains' own difficulty dominates the first panel (web is hard whatever happened), so
    forgetting and adaptation are read on the second, with a diverging colour scale centred on 0:
    red = worse than before the stream, blue = better. Every measured cell is annotated."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt
    import numpy as np

    values = matrix.values
    delta = values - values[:1]
    worse = delta if matrix.lower_is_better else -delta  # > 0: worse than before the stream
    rows = ["0 before"] + [f"{t} {d}" for t, d in enumerate(matrix.experiences, start=1)]
    width = 1.1 * len(matrix.domains)
    fig, axes = plt.subplots(1, 2, figsize=(2.8 + 2 * width, 1.0 + 0.45 * len(rows)))
    finite = worse[np.isfinite(worse)]
    span = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    panels = (
        (values, "viridis_r" if matrix.lower_is_better else "viridis", None, matrix.metric, "{:.2f}"),
        (worse, "RdBu_r", (-span, span), f"{matrix.metric}: change since row 0 (red = worse)", "{:+.3f}"),
    )
    for ax, (shown, cmap, limits, label, fmt) in zip(axes, panels):
        image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, aspect="auto",
                          **({} if limits is None else {"vmin": limits[0], "vmax": limits[1]}))
        ax.set_xticks(range(len(matrix.domains)), matrix.domains)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("evaluated domain")
        fig.colorbar(image, ax=ax, label=label)
        cell = delta if shown is worse else values
        for t in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isfinite(shown[t, j]):
                    r, g, b, _ = image.cmap(image.norm(shown[t, j]))
                    dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # light text on dark cells
                    ax.text(j, t, fmt.format(cell[t, j]), ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
    axes[0].set_ylabel("after experience")
    fig.tight_layout()
    return fig
