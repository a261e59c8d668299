"""A run stopped by SIGTERM (a scheduler's preemption or time limit) saves where it is and says so.

    with SigtermWatch() as watch:          # for the whole run, fits and evaluations alike
        ...                                # after each step: if watch.received: save, then stop
    raise RunPreempted("... continue with --resume")

SLURM, Kubernetes and torchrun stop a job with SIGTERM and a grace period before SIGKILL. Without
a handler the process dies at once and a resume repeats the steps since the last periodic
checkpoint; with one, the runner finishes the step in progress, writes its checkpoint and exits,
and `--resume` continues from that very step (bit for bit on CPU, like any resume).

Lightning registers its own SIGTERM handler for the length of every fit and evaluation and keeps
an earlier one beside it (`_SignalConnector`: "we have our own handler, but include existing ones
too"); its loops then raise `SIGTERMException` after the batch in progress, on every rank (it
broadcasts rank 0's flag), always between two batches. Lightning hands that exception to the
callbacks' `on_exception` before it leaves the fit, while the Trainer still holds the optimiser:
there the runner writes the checkpoint of the step just done (`StepHooks.on_sigterm`), then turns
the exception into `RunPreempted`. (Looking for the flag in the after-batch hook instead misses a
signal that lands after the hook has looked and before Lightning does.) A signal during a row's
evaluation stops that evaluation; the run continues from its last checkpoint. Outside Lightning's loops (strategy hooks between
experiences) this module's own handler sets the flag, and the runner stops at its next checkpoint.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from cl_platform.trainer import RunStopped

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class RunPreempted(RunStopped):
    """The run received SIGTERM and stopped after writing its checkpoint; the message names it."""


class SigtermWatch:
    """Records SIGTERM instead of dying of it, while the `with` block runs (main thread only:
    Python delivers signals there; elsewhere, e.g. a sweep's worker thread, it does nothing)."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = True

    def __enter__(self) -> "SigtermWatch":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
