"""The sweep file of `clp sweep` (experiments/multi/sweep.py): its fields, and every check made before
any trial starts (or any base model is pretrained).

    sweep = load("experiments/configs/sweeps/fast_lr_chunk.yaml", trials=None, storage=None)
    check_runs(sweep, where)             # the space against the run config and its strategy
    overrides({"cl.fwpkm.chunk": 64})    # ["cl.fwpkm.chunk=64", "cl.eval_split=dev"]

The file (fields of `Sweep`):

    run: ../default.yaml              # the run config every trial starts from, relative to this file
    name: fast_lr_chunk               # study name; outputs go to <runs_root>/sweep-<name>/
    trials: 12                        # COMPLETE + PRUNED trials to reach (re-runs add up to it)
    sampler: tpe                      # tpe | random, seeded by `seed` (and the worker, and the
    seed: 0                           #   trials already in the study: a continued study draws anew)
    storage: null                     # null: sqlite <runs_root>/sweep-<name>/study.db; or a URL;
                                      #   or journal:PATH, a log file on a shared disk (no server)
    space:                            # dotted run-config path -> distribution
      cl.fwpkm.lr_values: {type: float, low: 0.03, high: 3.0, log: true}
      cl.fwpkm.chunk: {type: categorical, choices: [32, 64, 128]}
      strategy.kwargs.fraction: {type: float, low: 0.01, high: 0.2}
    objective: {terms: {average_final: 1.0, average_forgetting: 1.0}, direction: minimize}
    # or several: {metrics: [average_forgetting, adaptation_gain], directions: [minimize, maximize]}
    pruner: {name: median, n_startup_trials: 3, n_warmup_steps: 8}    # one objective only
    overrides: [cl.mode=finetune, strategy.name=ewc]   # fixed, before every trial's sampled values

On the command line, `key=value` sets a field of this file, or, where `key` is not one of its
fields, the run config's for every trial (`runs_root=/shared/runs`, `cl.batch_size=4`:
`run_overrides`).

Objectives are always measured on the dev split: every trial's overrides end with
`cl.eval_split=dev`, and a space entry on `cl.eval_split` is refused, so choosing settings never
reads the eval split the tables quote. Refused before anything runs, each naming its field:
paths the run config does not have (each entry's bounds or choices are loaded through the run
config; `strategy.kwargs.*`, a free mapping, also through the strategy's constructor), paths that
would change the base model or where runs go (`model.*`, `pretrain.*`, `stream`, ...: every
trial must reuse the run config's one cached base), bad distributions, metrics `summary` does not
record (`metric_names()`), pruning a multi-objective study, a database that cannot be reached, and a
study of the same name whose space or objective differs (stored as a study user attribute).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from cl_platform.check import (ConfigError, apply_overrides, check, check_keys, is_int, is_number, read_yaml,
                               split_overrides)
from experiments.multi.sweep_journal import absolute, is_journal, journal_path

FORBIDDEN = ("model", "pretrain", "base_checkpoint", "stream", "runs_root", "name", "order", "cl.eval_split")
DIRECTIONS = ("minimize", "maximize")


def forbidden(path: str) -> bool:
    """A dotted path a sweep may not set: it would change the base model, the split or where runs go."""
    return path.split(".")[0] in FORBIDDEN or any(path == f or path.startswith(f + ".") for f in FORBIDDEN)


def metric_names() -> tuple[str, ...]:
    """What an objective may name: the metrics `analysis.metrics.summary` records (its registry
    `analysis.metrics.METRICS`), in summary order."""
    from analysis.metrics import METRICS

    return tuple(METRICS)


@dataclass
class Param:
    """One search-space entry (Optuna's suggest_float / suggest_int / suggest_categorical)."""

    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: list | None = None

    def __post_init__(self) -> None:
        check(self.type in ("float", "int", "categorical"), self, "type", "is not one of ['float', 'int', 'categorical']")
        if self.type == "categorical":
            check(isinstance(self.choices, list) and bool(self.choices), self, "choices", "must be a non-empty list")
            check(all(c is None or isinstance(c, (bool, int, float, str)) for c in self.choices), self, "choices",
                  "must hold scalars (numbers, strings, booleans, null)")
            check(len({json.dumps(c) for c in self.choices}) == len(self.choices), self, "choices", "has duplicates")
            for name in ("low", "high", "step"):
                check(getattr(self, name) is None, self, name, "is for float and int entries, not categorical")
            check(not self.log, self, "log", "is for float and int entries, not categorical")
            return
        check(self.choices is None, self, "choices", f"is for categorical entries, not {self.type}")
        number = is_int if self.type == "int" else is_number
        for name in ("low", "high"):
            check(number(getattr(self, name)), self, name, f"must be {'an int' if self.type == 'int' else 'a number'}")
        check(self.low < self.high, self, "high", f"must be > low ({self.low})")
        check(isinstance(self.log, bool), self, "log", "must be true or false")
        check(not self.log or self.low > 0, self, "low", "must be > 0 for a log-uniform entry")
        check(self.step is None or (number(self.step) and self.step > 0), self, "step", "must be a positive number")
        check(self.step is None or not self.log, self, "step", "cannot be combined with log: true")

    def candidates(self) -> list:
        """The values checked against the run config before anything runs."""
        return list(self.choices) if self.type == "categorical" else [self.low, self.high]

    def suggest(self, trial: Any, path: str) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(path, self.choices)
        if self.type == "int":
            return trial.suggest_int(path, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(path, self.low, self.high, step=self.step, log=self.log)


@dataclass
class Objective:
    """Single: `terms` {metric: weight}, value Σ weight · metric, one `direction`. Multi:
    `metrics` [m1, m2, ...] with one direction each in `directions`."""

    terms: dict[str, float] | None = None
    direction: str | None = None
    metrics: list[str] | None = None
    directions: list[str] | None = None

    def __post_init__(self) -> None:
        check((self.terms is None) != (self.metrics is None), self, "terms",
              "give either terms + direction (one objective) or metrics + directions (several)")
        if self.terms is not None:
            check(isinstance(self.terms, dict) and bool(self.terms)
                  and all(is_number(w) for w in self.terms.values()), self, "terms",
                  "must map metric names to numeric weights")
            check(self.directions is None, self, "directions", "is for several metrics; use direction")
            self.direction = self.direction or "minimize"
            check(self.direction in DIRECTIONS, self, "direction", f"is not one of {list(DIRECTIONS)}")
            names = list(self.terms)
        else:
            check(isinstance(self.metrics, list) and len(self.metrics) >= 2, self, "metrics",
                  "must list at least two metrics (one metric: use terms)")
            check(self.direction is None, self, "direction", "is for one objective; use directions")
            check(isinstance(self.directions, list) and len(self.directions) == len(self.metrics)
                  and all(d in DIRECTIONS for d in self.directions), self, "directions",
                  f"must give one of {list(DIRECTIONS)} per metric")
            names = self.metrics
        known = metric_names()
        unknown = [m for m in names if m not in known]
        check(not unknown, self, "terms" if self.terms is not None else "metrics",
              f"names unknown metric(s) {unknown}; recorded metrics (analysis.metrics.summary): {list(known)}")

    @property
    def is_multi(self) -> bool:
        return self.metrics is not None

    @property
    def study_directions(self) -> list[str]:
        return list(self.directions) if self.is_multi else [self.direction]

    @property
    def metric_names(self) -> list[str]:
        """One name per study value: the metrics, or the weighted sum written out."""
        if self.is_multi:
            return list(self.metrics)
        return [" + ".join(f"{w:g}·{m}" for m, w in self.terms.items())]

    def value(self, metrics: dict[str, float]) -> float | tuple[float, ...]:
        if self.is_multi:
            return tuple(metrics[m] for m in self.metrics)
        return sum(w * metrics[m] for m, w in self.terms.items())

    def describe(self) -> str:
        if self.is_multi:
            return ", ".join(f"{d} {m}" for m, d in zip(self.metrics, self.directions))
        return f"{self.direction} " + " + ".join(f"{w:g}·{m}" for m, w in self.terms.items())


@dataclass
class Pruner:
    """`median`: Optuna's MedianPruner on the mean forgetting-curve loss
    (experiments/multi/sweep_pruning.py); `none`: trials always run to the end."""

    name: str = "median"
    n_startup_trials: int = 3  # trials that finish before any is pruned
    n_warmup_steps: int = 0  # run steps before a trial can be pruned
    interval_steps: int = 1

    def __post_init__(self) -> None:
        check(self.name in ("median", "none"), self, "name", "is not one of ['median', 'none']")
        check(is_int(self.n_startup_trials, 0), self, "n_startup_trials", "must be an int >= 0")
        check(is_int(self.n_warmup_steps, 0), self, "n_warmup_steps", "must be an int >= 0")
        check(is_int(self.interval_steps, 1), self, "interval_steps", "must be a positive int")

    def make(self) -> Any:
        import optuna

        if self.name == "none":
            return optuna.pruners.NopPruner()
        return optuna.pruners.MedianPruner(n_startup_trials=self.n_startup_trials, n_warmup_steps=self.n_warmup_steps,
                                           interval_steps=self.interval_steps)


@dataclass
class Sweep:
    run: str  # the run config, relative to the sweep file
    name: str
    space: dict[str, Param]
    objective: Objective
    trials: int = 10
    sampler: str = "tpe"
    startup_trials: int = 4  # TPE: random trials before it models the space
    seed: int = 0
    # SQLAlchemy URL, or journal:PATH (Optuna's JournalStorage on a file every worker mounts; PATH
    # relative to the working folder, as an SQLite URL's is); null = sqlite study.db in the sweep folder
    storage: str | None = None
    # A folder every worker mounts (Optuna's FileSystemArtifactStore; relative to the sweep file):
    # each trial's checkpoints are uploaded there, so a retry on another machine continues them
    # (experiments/multi/sweep_artifacts.py). null: checkpoints stay in the local trial folder.
    artifacts: str | None = None
    pruner: Pruner | None = None  # null: median for one objective, none for several
    # Dotted overrides every trial gets before its sampled values (`cl.mode=finetune`,
    # `strategy.name=ewc`): a sweep of one comparison entry's settings without a new run file.
    overrides: list[str] = dataclasses.field(default_factory=list)
    # Run-config overrides every trial gets first (`clp sweep FILE runs_root=DIR`: a command-line
    # key that is not a field of this file), as if written into the run config. Unlike
    # `overrides`, they may say where runs go and what they read; a continued study must be given
    # the same ones but `runs_root` (each machine mounts the shared folder where it can).
    run_overrides: list[str] = dataclasses.field(default_factory=list)
    heartbeat_interval: int = 60  # seconds between a running trial's heartbeats
    grace_period: int = 180  # seconds without one before a trial counts as dead and is retried
    max_retry: int = 2  # retries of one killed trial

    def __post_init__(self) -> None:
        check(isinstance(self.run, str) and bool(self.run), self, "run", "must be the path of a run config")
        check(isinstance(self.name, str) and bool(self.name) and "/" not in self.name, self, "name",
              "must be a non-empty string without '/'")
        check(is_int(self.trials, 1), self, "trials", "must be a positive int")
        check(self.sampler in ("tpe", "random"), self, "sampler", "is not one of ['tpe', 'random']")
        check(is_int(self.startup_trials, 1), self, "startup_trials", "must be a positive int")
        check(is_int(self.seed), self, "seed", "must be an int")
        check(self.storage is None or (isinstance(self.storage, str) and bool(self.storage)), self, "storage",
              "must be an SQLAlchemy URL, journal:PATH or null")
        check(self.artifacts is None or (isinstance(self.artifacts, str) and bool(self.artifacts)), self,
              "artifacts", "must be a folder path or null")
        check(bool(self.space), self, "space", "must map at least one dotted run-config path to a distribution")
        for name in ("heartbeat_interval", "grace_period"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int (seconds)")
        check(is_int(self.max_retry, 0), self, "max_retry", "must be an int >= 0")
        check(isinstance(self.overrides, list) and all(isinstance(o, str) and "=" in o for o in self.overrides),
              self, "overrides", "must be a list of dotted overrides 'path=value'")
        check(isinstance(self.run_overrides, list) and all(isinstance(o, str) and "=" in o for o in self.run_overrides),
              self, "run_overrides", "must be a list of 'key=value' run-config overrides")
        check(self.grace_period > self.heartbeat_interval, self, "grace_period", "must exceed heartbeat_interval")
        if self.pruner is None:
            self.pruner = Pruner(name="none" if self.objective.is_multi else "median")
        check(not (self.objective.is_multi and self.pruner.name != "none"), self, "pruner",
              "multi-objective studies cannot prune (Optuna's pruners compare one value); set pruner: {name: none}")

    @property
    def prunes(self) -> bool:
        return self.pruner.name != "none"

    def space_record(self) -> dict[str, Any]:
        """What a stored study must match to be continued (a study user attribute)."""
        record = {"space": {p: dataclasses.asdict(v) for p, v in self.space.items()},
                  "objective": dataclasses.asdict(self.objective)}
        if self.overrides:  # absent when empty: studies made before the field still match
            record["overrides"] = list(self.overrides)
        run = [o for o in self.run_overrides if o.partition("=")[0] != "runs_root"]
        if run:
            record["run_overrides"] = run
        return record

    def trial_overrides(self, params: dict[str, Any]) -> list[str]:
        """A trial's dotted overrides: the sweep's fixed ones, its parameters, then the dev split
        (always last, so it wins)."""
        return [*self.run_overrides, *self.overrides, *overrides(params)]


# --- loading and checking -------------------------------------------------------------------------
def _part(cls: type, data: Any, where: str) -> Any:
    """Dataclass `cls` from a mapping; a failed check names `where.field`."""
    check_keys(cls, data, where)
    try:
        return cls(**data)
    except ConfigError as err:
        raise ConfigError(f"{where}.{err.field}: {err}", field=f"{where}.{err.field}") from None


def load(path: str | Path, trials: int | None = None, storage: str | None = None,
         overrides: Sequence[str] = ()) -> Sweep:
    """The sweep file with `key=value` overrides, then `--trials` / `--storage`, applied; errors
    name the file and field."""
    path = Path(path)
    overrides, run_overrides = split_overrides(overrides, Sweep)
    data = apply_overrides(read_yaml(path, "sweep config"), overrides, "sweep config")
    data["run_overrides"] = [*data.get("run_overrides", []), *run_overrides]
    where = f"sweep config {path}"
    check_keys(Sweep, data, where)
    for name in ("run", "name", "space", "objective"):
        if name not in data:
            raise ConfigError(f"{where}: field '{name}' is required", field=name)
    if trials is not None:
        data["trials"] = trials
    if storage is not None:
        data["storage"] = storage
    space = data["space"]
    if not isinstance(space, dict):
        raise ConfigError(f"{where}: field 'space' must map dotted run-config paths to distributions", field="space")
    data["space"] = {str(p): _part(Param, spec, f"{where}: space.{p}") for p, spec in space.items()}
    data["objective"] = _part(Objective, data["objective"], f"{where}: objective")
    if data.get("pruner") is not None:
        data["pruner"] = _part(Pruner, data["pruner"], f"{where}: pruner")
    try:
        sweep = Sweep(**data)
    except ConfigError as err:
        raise ConfigError(f"{where}: field '{err.field}': {err}", field=err.field) from None
    from experiments.config_files import relative_to

    sweep.run = relative_to(path, sweep.run, "run", overrides)
    if sweep.artifacts is not None:
        sweep.artifacts = relative_to(path, sweep.artifacts, "artifacts", overrides)
    if sweep.storage is not None and is_journal(sweep.storage):
        sweep.storage = absolute(sweep.storage)  # workers and the outputs name one file
    return sweep


def format_value(value: Any) -> str:
    """A value as a dotted-override string the config loader parses back to the same value."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        text = repr(value)
        # YAML 1.1 reads "1e-05" as a string; "1.0e-05" is a float.
        if "e" in text and "." not in text.split("e")[0]:
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    if isinstance(value, int):
        return str(value)
    return value if yaml.safe_load(value) == value and ("=" not in value) else json.dumps(value)


def overrides(params: dict[str, Any]) -> list[str]:
    """A trial's dotted overrides: its parameters, then the dev split (always last, so it wins)."""
    return [f"{p}={format_value(v)}" for p, v in params.items()] + ["cl.eval_split=dev"]


def _select(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for key in path.split("."):
        node = node[key]
    return node


def check_runs(sweep: Sweep, where: str) -> Any:
    """Every space entry's values loaded through the run config (and its strategy), the dev
    split present; returns the setup of the first values. Loads the stream, trains nothing."""
    from cl_platform.config import load_config
    from experiments.setup import load_setup, make_strategy

    for path in sweep.space:
        if forbidden(path):
            why = ("is set by the sweep (always dev)" if path == "cl.eval_split"
                   else "would change the base model or where runs go, not a setting of the continual phase")
            raise ConfigError(f"{where}: field 'space.{path}': {why}", field=f"space.{path}")
    for i, item in enumerate(sweep.overrides):
        path = item.split("=", 1)[0].strip()
        if forbidden(path):
            raise ConfigError(f"{where}: field 'overrides[{i}]': {path} would change the base model, the split or "
                              "where runs go, not a setting of the continual phase", field=f"overrides[{i}]")
        try:
            load_config(sweep.run, [*sweep.run_overrides, *sweep.overrides[: i + 1]])
        except ConfigError as err:
            raise ConfigError(f"{where}: field 'overrides[{i}]' ({item!r}) is refused by run config {sweep.run}: {err}",
                              field=f"overrides[{i}]") from None
    first = {p: spec.candidates()[0] for p, spec in sweep.space.items()}
    configs = {}
    for path, spec in sweep.space.items():
        for value in spec.candidates():
            field_ = f"space.{path}"
            try:
                cfg = load_config(sweep.run, sweep.trial_overrides({**first, path: value}))
                loaded = _select(cfg.to_dict(), path)
            except (ConfigError, KeyError, TypeError) as err:
                raise ConfigError(f"{where}: field '{field_}': value {value!r} is refused by run config "
                                  f"{sweep.run}: {err}", field=field_) from None
            if loaded != value:
                raise ConfigError(f"{where}: field '{field_}': value {value!r} loads as {loaded!r}", field=field_)
            configs[(path, json.dumps(value))] = cfg
    try:
        setup = load_setup(sweep.run, sweep.trial_overrides(first))  # the stream, and its dev split
    except ConfigError as err:
        raise ConfigError(f"{where}: field 'run' ({sweep.run}) with the first values of the space: {err}",
                          field="run") from None
    for (path, value), cfg in configs.items():
        if path.startswith("strategy"):  # kwargs are a free mapping: only the strategy knows them
            try:
                make_strategy(dataclasses.replace(setup, config=cfg))
            except ConfigError as err:
                raise ConfigError(f"{where}: field 'space.{path}': value {value}: {err}", field=f"space.{path}") from None
    make_strategy(setup)
    return setup


def sweep_dir(sweep: Sweep) -> Path:
    from cl_platform.config import load_config

    return Path(load_config(sweep.run, sweep.run_overrides).runs_root) / f"sweep-{sweep.name}"


def storage_url(sweep: Sweep) -> str:
    return sweep.storage or f"sqlite:///{(sweep_dir(sweep) / 'study.db').resolve()}"


def check_storage(url: str, field_: str, where: str) -> None:
    """The database answers (a 5-second connect timeout where the driver has one). SQLite: the
    file's folder exists (connecting would create the file)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    def refuse(why: str) -> None:
        raise ConfigError(f"{where}: field '{field_}': cannot use database {url!r}: {why}", field=field_)

    if is_journal(url):  # a log file: its folder exists and takes files; the file, if there, is one
        log = journal_path(url)
        if not log.parent.is_dir():
            refuse(f"folder {log.parent} does not exist")
        if log.exists() and not log.is_file():
            refuse(f"{log} is not a file")
        from cl_platform.check import check_writable

        check_writable(log.parent, field_, where)  # probed by writing a file, as a runs root is
        return
    try:
        parsed = make_url(url)
    except Exception as err:  # sqlalchemy.exc.ArgumentError and friends
        refuse(f"not an SQLAlchemy URL ({err})")
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not Path(db).resolve().parent.is_dir():
            refuse(f"folder {Path(db).parent} does not exist")
        return
    connect_args = {"connect_timeout": 5} if backend in ("postgresql", "mysql", "mariadb") else {}
    try:
        engine = create_engine(parsed, connect_args=connect_args)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as err:  # driver missing, host down, wrong credentials: all the same to the user
        refuse(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)


def check_study(sweep: Sweep, storage: Any, where: str) -> None:
    """A study of this name in `storage` must have been made by the same space, objective, fixed
    overrides and run-config overrides (but `runs_root`)."""
    import optuna

    if sweep.name not in {s.study_name for s in optuna.study.get_all_study_summaries(storage)}:
        return
    stored = optuna.load_study(study_name=sweep.name, storage=storage).user_attrs.get("sweep")
    mine = json.loads(json.dumps(sweep.space_record()))
    if stored is None:
        raise ConfigError(f"{where}: field 'name': the storage holds a study {sweep.name!r} not made by clp sweep; "
                          f"choose another name", field="name")
    from cl_platform.config import dict_diff

    for part in ("space", "objective", "overrides", "run_overrides"):
        if stored.get(part) != mine.get(part):
            diff = "; ".join(dict_diff(stored.get(part), mine.get(part))[:5])
            raise ConfigError(f"{where}: field '{part}': study {sweep.name!r} in the storage was made with a different "
                              f"{part} ({diff}); use another name or storage", field=part)
