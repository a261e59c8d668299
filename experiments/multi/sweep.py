"""`clp sweep SWEEP.yaml`: an Optuna study over run-config settings (write rule, chunk size,
strategy arguments), resumable, prunable and parallel, on a real database.

    clp sweep experiments/configs/sweeps/fast_lr_chunk.yaml                 # creates or continues the study
    clp sweep experiments/configs/sweeps/fast_lr_chunk.yaml --trials 16     # more trials than the file says
    clp sweep experiments/configs/sweeps/fast_lr_chunk.yaml --workers 2     # this process + 1 more, one study
    clp sweep SWEEP.yaml --storage postgresql://user@host/db        # any SQLAlchemy URL
    clp sweep SWEEP.yaml --storage journal:/shared/sweeps/study.log  # a log file on a shared disk, no server

The file's fields and the checks made before any trial starts: experiments/multi/sweep_config.py.

A trial is an ordinary run (`experiments/run.py:execute`) of the run config with the sweep's
fixed `overrides`, then the sampled values as dotted overrides, plus `cl.eval_split=dev`: objectives are always measured on the dev
split, so that choosing settings never reads the eval split the tables quote (a space entry on
`cl.eval_split` is refused). The run goes to `<sweep dir>/trials/<trial number>/`, reuses the run
config's one cached base model (space entries that would change the base, `model.*` and
`pretrain.*`, are refused), and resumes if that folder holds an unfinished run. The objective is
computed from `analysis.metrics.summary` (its metrics: `analysis.metrics.METRICS`); the trial records its
run folder, overrides and every summary metric as user attributes.

Concurrency, through the study's storage only (no lock file: workers on other machines share
nothing but the database and, for the trials' run folders, `runs_root`): a worker asks for a
trial while COMPLETE + PRUNED + RUNNING + WAITING trials are below the target. The storage numbers
trials atomically, so two workers that asked at once hold different numbers; trial n runs only if
fewer than the target live trials have a lower number, otherwise it is marked a surplus trial
(state FAIL, user attribute `surplus`, no parameters, never run, left out of trials.csv) and the
worker stops. Whatever the interleaving, the trials that run are exactly the target. Queued
(WAITING) trials, retries or `study.enqueue_trial`, are always run (the storage hands each to one
worker: Optuna pops it with a conditional state update). With heartbeats on (Optuna's, on RDB
storage; experiments/multi/sweep_journal.py's, on JournalStorage), a worker killed mid-trial
leaves a RUNNING trial whose heartbeat stops; after `grace_period` seconds the next worker fails it
and queues a retry (`RetryHeartbeatStaleTrialCallback`) that continues the same run folder from its
last checkpoint — on another machine too when the sweep names an `artifacts` folder every worker
mounts (each checkpoint is uploaded there: experiments/multi/sweep_artifacts.py). A trial interrupted by Ctrl-C, or by SIGTERM (its run saves the step in progress;
the worker exits 143), is queued for a retry the same way. A run that
stops on a non-finite loss (`RunStopped`, e.g. a learning rate that diverges) or whose folder another
live process runs (`FolderBusy`: a retry of a trial whose worker is slow, not dead) is a FAIL trial, not
counted; `MAX_FAILURES` failed trials in a row stop the worker.

Outputs (`experiments/multi/sweep_report.py`) are rewritten from the study at the end of every
`clp sweep`: best.yaml (or pareto.json + pareto/), trials.csv, plots/ and tensorboard/.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from cl_platform.check import ConfigError
from cl_platform.file_lock import FolderBusy
from experiments.multi.sweep_config import Sweep, check_runs, check_storage, check_study, load, storage_url, \
    sweep_dir
from experiments.multi.sweep_journal import beating, fail_stale, is_journal, make_journal

MAX_FAILURES = 3


def make_storage(sweep: Sweep, url: str) -> Any:
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    if is_journal(url):  # a log file on a shared disk; the heartbeat is sweep_journal's
        return make_journal(url)
    # SQLite shared by several worker processes: wait for a lock instead of failing at once.
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry = RetryHeartbeatStaleTrialCallback(max_retry=sweep.max_retry, inherit_intermediate_values=True)
        return RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=sweep.heartbeat_interval,
                          grace_period=sweep.grace_period, heartbeat_stale_trial_callback=retry)


# --- running ----------------------------------------------------------------------------------------
def folder_number(trial: Any) -> int:
    """The run folder a trial uses: its own number, or the original's for a retry (so the retry
    continues that run from its checkpoint)."""
    return trial.system_attrs.get("failed_trial", trial.number)


def live_states() -> tuple:
    """The states of trials that count towards the target: done (COMPLETE, PRUNED), running, queued."""
    from optuna.trial import TrialState

    return TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING


def counted(study: Any) -> int:
    return len(study.get_trials(deepcopy=False, states=live_states()))


class Surplus(Exception):
    """The trial was created after the target was reached (another worker asked at the same time)."""


def claims_a_place(study: Any, number: int, target: int) -> bool:
    """Whether trial `number` (just created or popped from the queue, RUNNING) is one of the
    target's: a queued trial (retry or enqueued: `fixed_params`) always is; a new one if fewer
    than `target` live trials have a lower number. Trials are numbered by the storage, so every
    worker reaches the same verdict on every trial."""
    trials = study.get_trials(deepcopy=False)  # one read of the storage for the verdict
    if "fixed_params" in trials[number].system_attrs:
        return True
    live = live_states()
    return sum(t.number < number and t.state in live for t in trials) < target


def make_sampler(sweep: Sweep, worker: int, existing: int) -> Any:
    """Seeded by the sweep's seed, the worker and the trials already there: two workers, or a
    continued study, do not draw the same random points again."""
    import optuna

    seed = int(hashlib.sha256(f"{sweep.seed}:{worker}:{existing}".encode()).hexdigest()[:8], 16)
    if sweep.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=sweep.startup_trials)


class TrialObjective:
    """One trial: sampled values → overrides → an ordinary run in <sweep dir>/trials/<n> → summary
    metrics → objective value(s)."""

    def __init__(self, sweep: Sweep, out: Path, say: Callable[[str], None]):
        self.sweep, self.out, self.say = sweep, out, say
        self.store = None
        if sweep.artifacts is not None:
            from experiments.multi.sweep_artifacts import make_store

            self.store = make_store(sweep.artifacts)
        self.number: int | None = None
        self.preempted = False

    def __call__(self, trial: Any) -> float | tuple[float, ...]:
        import optuna

        self.number = trial.number
        self.preempted = False
        if not claims_a_place(trial.study, trial.number, self.sweep.trials):
            trial.set_user_attr("surplus", True)
            raise Surplus(f"trial {trial.number} not run: the study reached its {self.sweep.trials} trials "
                          f"while this worker asked for one")
        storage = trial.study._storage
        beats = (beating(storage, trial._trial_id, self.sweep.heartbeat_interval)
                 if isinstance(storage, optuna.storages.JournalStorage)
                 else contextlib.nullcontext())  # RDB storage: Optuna's own heartbeat thread beats
        with beats:
            return self._run(trial)

    def _run(self, trial: Any) -> float | tuple[float, ...]:
        import optuna

        from analysis.metrics import METRICS, summary
        from experiments.run import execute
        from cl_platform.preemption import RunPreempted
        from experiments.multi.sweep_pruning import CurvePruning

        params = {path: spec.suggest(trial, path) for path, spec in self.sweep.space.items()}
        folder = self.out / "trials" / str(folder_number(trial.study.get_trials(deepcopy=False)[trial.number]))
        trial.set_user_attr("run_folder", str(folder))
        trial.set_user_attr("overrides", self.sweep.trial_overrides(params))
        callbacks = [CurvePruning(trial, self.sweep.objective.direction)] if self.sweep.prunes else []
        if self.store is not None:
            from experiments.multi.sweep_artifacts import TrialCheckpoints, restore

            restore(self.store, trial.study, folder, lambda line: self.say(f"[trial {trial.number}] {line}"))
            callbacks.append(TrialCheckpoints(self.store, trial.study, trial, folder))
        again = "" if folder.name == str(trial.number) else f" (retry, continuing trial {folder.name}'s run)"
        self.say(f"--- trial {trial.number}{again}: {' '.join(self.sweep.trial_overrides(params))}")
        try:
            _, results, _ = execute(self.sweep.run, self.sweep.trial_overrides(params), resume=True, run_dir=folder, progress_bar=False,
                                    say=lambda line: self.say(f"[trial {trial.number}] {line}"), callbacks=callbacks)
        except optuna.TrialPruned as err:
            self.say(f"--- trial {trial.number}: {err}; its run folder stays resumable")
            raise
        except RunPreempted:
            self.preempted = True  # the worker stops after Optuna has recorded the trial
            raise
        metrics = {k: v for k, v in summary(results).items() if k in METRICS}
        trial.set_user_attr("metrics", {k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        value = self.sweep.objective.value(metrics)
        self.say(f"--- trial {trial.number}: objective {value}")
        return value


def create_study(sweep: Sweep, storage: Any, worker: int) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # clp sweep says what happens itself

    existing = 0
    if sweep.name in {s.study_name for s in optuna.study.get_all_study_summaries(storage)}:
        existing = len(optuna.load_study(study_name=sweep.name, storage=storage).trials)
    study = optuna.create_study(storage=storage, study_name=sweep.name, load_if_exists=True,
                                directions=sweep.objective.study_directions,
                                sampler=make_sampler(sweep, worker, existing), pruner=sweep.pruner.make())
    if "sweep" not in study.user_attrs:
        study.set_user_attr("sweep", sweep.space_record())
    if study.metric_names is None:  # named axes in Optuna Dashboard and in Optuna's own plots
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(sweep.objective.metric_names)
    return study


def optimize(sweep: Sweep, study: Any, out: Path, say: Callable[[str], None]) -> None:
    """Run trials until the study holds `sweep.trials` COMPLETE + PRUNED trials (counting those
    running or queued elsewhere)."""
    import optuna
    from optuna.trial import TrialState

    from cl_platform.preemption import RunPreempted
    from cl_platform.trainer import RunStopped

    objective = TrialObjective(sweep, out, say)
    failures = 0
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # dead workers' trials → FAIL + queued retry
        if isinstance(study._storage, optuna.storages.JournalStorage):  # the same, for a journal file
            fail_stale(study, sweep.grace_period, sweep.max_retry)
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if counted(study) >= sweep.trials and not waiting:  # queued trials (retries) are run regardless
            return
        objective.number = None
        try:
            study.optimize(objective, n_trials=1, catch=(RunStopped, FolderBusy, Surplus))
        except KeyboardInterrupt:
            _queue_retry(sweep, study, objective.number)
            raise
        number = objective.number
        if objective.preempted:
            # SIGTERM: the trial's run wrote its checkpoint; queued again (as a killed worker's
            # would be after its grace period), the next worker continues that run folder.
            _queue_retry(sweep, study, number)
            raise RunPreempted(f"sweep {sweep.name!r} stopped by SIGTERM during trial {number}, which is queued "
                               f"again: the same clp sweep command continues it from its checkpoint")
        trial = study.get_trials(deepcopy=False)[number] if number is not None else None
        if trial is not None and trial.user_attrs.get("surplus"):
            say(f"--- trial {number}: not run (surplus: the study reached its {sweep.trials} trials meanwhile)")
            continue  # the loop's count now says the target is reached, unless a trial failed meanwhile
        state = trial.state if trial is not None else TrialState.FAIL
        failures = failures + 1 if state == TrialState.FAIL else 0
        if failures >= MAX_FAILURES:
            raise SweepError(f"{failures} trials in a row failed (last: trial {number}); see the output above")


def _queue_retry(sweep: Sweep, study: Any, number: int | None) -> None:
    """An interrupted trial (Ctrl-C) is queued again like a killed one, to continue its run folder."""
    import optuna
    from optuna.trial import TrialState

    if number is None:
        return
    trial = study.get_trials(deepcopy=False)[number]
    if trial.state == TrialState.FAIL:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            from optuna.storages import RetryHeartbeatStaleTrialCallback

            RetryHeartbeatStaleTrialCallback(max_retry=sweep.max_retry, inherit_intermediate_values=True)(study, trial)


class SweepError(RuntimeError):
    """The sweep cannot go on (trials keep failing, a worker failed)."""


def spawn_workers(path: Path, sweep: Sweep, url: str, count: int, out: Path, say: Callable[[str], None],
                  overrides: Sequence[str] = ()) -> list:
    """`count` more `clp sweep` processes on the same file and study; their output goes to
    <sweep dir>/workers/worker-<i>.log."""
    logs = out / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(1, count + 1):
        log = open(logs / f"worker-{i}.log", "w")
        cmd = [sys.executable, "-m", "experiments.cli", "sweep", str(path), *overrides, "--trials", str(sweep.trials),
               "--storage", url, "--worker-index", str(i)]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
        say(f"worker {i}: pid {procs[-1][0].pid}, log {logs / f'worker-{i}.log'}")
    return procs


def run(path: str | Path, trials: int | None = None, workers: int = 1, storage: str | None = None,
        worker_index: int = 0, say: Callable[[str], None] = print, overrides: Sequence[str] = ()) -> tuple[Path, Any]:
    """Check everything, create or continue the study, run trials (with `workers` - 1 extra
    processes, given the same `key=value` overrides), then write the reports (not in extra
    workers). Returns (sweep dir, study)."""
    path = Path(path)
    sweep = load(path, trials, storage, overrides)
    where = f"sweep config {path}"
    if workers < 1:
        raise ConfigError(f"--workers {workers}: must be >= 1", field="workers")
    check_runs(sweep, where)
    out = sweep_dir(sweep)
    url = storage_url(sweep)
    field_ = "--storage" if storage is not None else "storage"
    if sweep.storage is not None:
        check_storage(url, field_, where)
    if sweep.artifacts is not None:
        from cl_platform.check import check_writable

        check_writable(sweep.artifacts, "artifacts", where)
    store = make_storage(sweep, url) if sweep.storage is not None or (out / "study.db").is_file() else None
    if store is not None:
        check_study(sweep, store, where)
    out.mkdir(parents=True, exist_ok=True)
    store = store or make_storage(sweep, url)
    study = create_study(sweep, store, worker_index)
    say(f"sweep {sweep.name}: study in {url}, {counted(study)} of {sweep.trials} trials there; "
        f"objective {sweep.objective.describe()} on the dev split; outputs in {out}/")
    procs = spawn_workers(path, sweep, url, workers - 1, out, say, overrides) if workers > 1 else []
    try:
        optimize(sweep, study, out, say)
    except BaseException:
        for proc, _ in procs:  # they would go on in the background, unseen
            proc.terminate()
        raise
    finally:
        bad = []
        for proc, log in procs:
            if proc.wait() != 0:
                bad.append(f"{Path(log.name).name} (exit {proc.returncode})")
            log.close()
    if bad:
        raise SweepError(f"worker(s) failed: {', '.join(bad)}; logs in {out / 'workers'}")
    if worker_index == 0:
        from experiments.multi.sweep_report import write_reports

        write_reports(sweep, study, out, say)
    return out, study


def main(config: str, overrides: Sequence[str] = (), trials: int | None = None, workers: int = 1,
         storage: str | None = None, worker_index: int = 0) -> int:
    run(config, trials, workers, storage, worker_index, overrides=overrides)
    return 0
