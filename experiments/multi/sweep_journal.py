"""A sweep without a database server: Optuna's JournalStorage on a file every worker mounts,
with the heartbeat Optuna gives only its RDB storage.

    storage: journal:/shared/sweeps/fast_lr.log          # in the sweep file, or --storage journal:PATH

`JournalStorage(JournalFileBackend(path))` appends every change of the study to one log file under
a file lock (a symlink lock: NFS v2 and later), so trial numbering and the pop of a queued trial are
atomic as they are on a database. What it lacks (Optuna 5.1) is `BaseHeartbeat`: a worker killed
mid-trial would leave its trial RUNNING for ever, counted as live, and the study would end short of
its target. So a running trial beats here: a thread stores the wall-clock time as the trial's
system attribute `HEARTBEAT` every `heartbeat_interval` seconds, and before asking for a trial a
worker fails every RUNNING trial whose last beat (or start) is older than `grace_period` and
queues its retry with Optuna's own `RetryHeartbeatStaleTrialCallback`, as `fail_stale_trials`
does for RDB storage. Two workers failing the same stale trial write two FAIL records; the journal
applies the first and raises `UpdateFinishedTrialError` for the other, so exactly one retry is
queued. Beats are compared with this machine's clock: the machines must agree on the time to well
under `grace_period` (NTP does).
"""
from __future__ import annotations

import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

SCHEME = "journal:"
HEARTBEAT = "clp:heartbeat"  # system attribute: seconds since the epoch of the trial's last beat


def is_journal(url: str) -> bool:
    return url.startswith(SCHEME)


def journal_path(url: str) -> Path:
    return Path(url[len(SCHEME):])


def absolute(url: str) -> str:
    """`journal:PATH` with PATH made absolute (relative paths are relative to the working folder,
    as SQLite URLs are), so that spawned workers and the study record name the same file."""
    return SCHEME + str(journal_path(url).expanduser().resolve())


def make_journal(url: str) -> Any:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(journal_path(url))))


@contextmanager
def beating(storage: Any, trial_id: int, interval: float) -> Iterator[None]:
    """Store a beat now and every `interval` seconds until the block ends (or the trial is
    finished by someone else: a worker that found it stale)."""
    from optuna.exceptions import UpdateFinishedTrialError

    stop = threading.Event()

    def beat() -> bool:
        try:
            storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
            return True
        except UpdateFinishedTrialError:
            return False

    def loop() -> None:
        while not stop.wait(interval) and beat():
            pass

    beat()
    thread = threading.Thread(target=loop, name=f"clp-heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale(study: Any, grace_period: float, max_retry: int) -> list[int]:
    """Fail the RUNNING trials of `study` without a beat for `grace_period` seconds and queue one
    retry each (up to `max_retry` per lineage). Returns the numbers this worker failed."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages import RetryHeartbeatStaleTrialCallback
    from optuna.trial import TrialState

    now, failed = time.time(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # The newer of its last beat and its start: a retry inherits the killed trial's system
        # attributes, its last beat included, and is not stale the moment it is popped.
        marks = [float(trial.system_attrs.get(HEARTBEAT, 0.0))]
        if trial.datetime_start is not None:
            marks.append(trial.datetime_start.timestamp())  # naive local time, as the journal stores it
        if now - max(marks) <= grace_period:
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # another worker failed it first and queued the retry
        failed.append(trial.number)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retry, inherit_intermediate_values=True)
            retry(study, study._storage.get_trial(trial._trial_id))
    return failed
