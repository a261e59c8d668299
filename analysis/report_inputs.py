"""What `clp report` can read, found and checked before anything is drawn or written:

    run folder         results.json (+ config.yaml, run.json, strategy.json, tensorboard/ when there)
    comparison folder  comparison.json (`clp compare`), whose members are run folders
    sweep folder       trials.csv (`clp sweep`), with best.yaml or pareto.json, plots/, study.db

    item = load_input("runs/default-15a9b12c8fa9")     # RunInput | ComparisonInput | SweepInput

A path that is none of these, a run folder killed before its first results row or written with
another results schema raises `ReportInputError` naming the path and what is missing, so a report
is never made from half of its inputs. Reads files only (numpy, yaml, json, csv): no model code.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cl_platform.results import SCHEMA_VERSION, ResultsFormatError, RunResults


class ReportInputError(ValueError):
    """A report input is missing, incomplete or of an unknown format; the message names the path."""


@dataclass
class RunInput:
    path: Path
    results: RunResults
    config: dict[str, Any]  # config.yaml as plain data ({} when the folder has none)
    record: dict[str, Any]  # run.json ({} when absent)
    strategy: dict[str, Any] | None  # strategy.json, written after every experience
    label: str = ""  # how the report names this run (the folder name unless two runs share it)

    @property
    def tensorboard(self) -> Path | None:
        folder = self.path / "tensorboard"
        return folder if folder.is_dir() else None


@dataclass
class ComparisonInput:
    path: Path
    data: dict[str, Any]  # comparison.json: entries (the table), members (per entry, per seed), seeds
    members: dict[str, list[RunInput]] = field(default_factory=dict)  # entry -> readable member runs
    missing: list[str] = field(default_factory=list)  # member folders that could not be read


@dataclass
class SweepInput:
    path: Path
    trials: list[dict[str, str]]  # trials.csv rows
    value_columns: list[str]  # "value", or "value_<metric>" per objective
    param_columns: list[str]
    best_yaml: str | None
    pareto: dict[str, Any] | None
    plots: dict[str, Path]  # plots/<name>.png written by `clp sweep`, by name


def load_input(path: str | Path) -> RunInput | ComparisonInput | SweepInput:
    path = Path(path)
    if not path.exists():
        raise ReportInputError(f"{path}: does not exist")
    if not path.is_dir():
        raise ReportInputError(f"{path}: not a folder (a report reads a run, comparison or sweep folder)")
    if (path / "comparison.json").is_file():
        return load_comparison(path)
    if (path / "trials.csv").is_file():
        return load_sweep(path)
    if any((path / name).exists() for name in ("results.json", "run.json", "config.yaml")):
        return load_run(path)
    if (path / "study.db").is_file():
        raise ReportInputError(f"{path}: sweep folder without trials.csv (run the same `clp sweep` again "
                               "to rewrite its outputs)")
    raise ReportInputError(f"{path}: not a run folder (no results.json), comparison folder (no comparison.json) "
                           "or sweep folder (no trials.csv)")


def load_run(path: Path) -> RunInput:
    results_path = path / "results.json"
    if not results_path.is_file():
        raise ReportInputError(f"{path}: run folder without results.json: the run was stopped before its first "
                               "results row (continue it with `clp run CONFIG --resume`)")
    try:
        data = json.loads(results_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{results_path}: not valid JSON ({err})") from None
    # Checked before parsing: an older file's other differences would otherwise surface as a
    # confusing missing-field message.
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        found = "no schema_version field" if version is None else f"schema_version {version!r}"
        raise ReportInputError(f"{results_path}: older or unknown results schema ({found}; this code reads "
                               f"schema_version {SCHEMA_VERSION})")
    try:
        results = RunResults.from_dict(data)
    except ResultsFormatError as err:
        raise ReportInputError(f"{results_path}: results schema {SCHEMA_VERSION} expected, but {err}") from None
    if results.matrix.last_complete_row < 0:
        raise ReportInputError(f"{results_path}: no complete results row (the run was stopped during its "
                               "before-training evaluation, row 0)")
    return RunInput(path=path, results=results, config=_yaml_or_empty(path / "config.yaml"),
                    record=_json_or_empty(path / "run.json"), strategy=_json_or_none(path / "strategy.json"),
                    label=path.name)


def load_comparison(path: Path) -> ComparisonInput:
    try:
        data = json.loads((path / "comparison.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{path / 'comparison.json'}: not valid JSON ({err})") from None
    for key in ("entries", "members"):
        if not isinstance(data.get(key), dict) or not data[key]:
            raise ReportInputError(f"{path / 'comparison.json'}: missing or empty field '{key}'")
    comp = ComparisonInput(path=path, data=data)
    for entry, members in data["members"].items():
        for member in members:
            folder = _member_folder(path, str(member.get("folder", "")))
            if folder is None:
                comp.missing.append(str(member.get("folder")))
                continue
            run = load_run(folder)
            run.label = f"{entry} seed {member.get('seed')}"
            comp.members.setdefault(entry, []).append(run)
    return comp


def _member_folder(comparison: Path, recorded: str) -> Path | None:
    """A member's run folder: as recorded (absolute, or relative to where `clp compare` ran), else
    beside the comparison folder (both live in the same runs root, which may have moved)."""
    for candidate in (Path(recorded), comparison.parent / Path(recorded).name):
        if recorded and (candidate / "results.json").is_file():
            return candidate
    return None


def load_sweep(path: Path) -> SweepInput:
    with (path / "trials.csv").open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        columns = list(reader.fieldnames or [])
        trials = list(reader)
    for key in ("number", "state"):
        if key not in columns:
            raise ReportInputError(f"{path / 'trials.csv'}: missing column '{key}'")
    values = [c for c in columns if c == "value" or c.startswith("value_")]
    if not values:
        raise ReportInputError(f"{path / 'trials.csv'}: no objective column ('value' or 'value_<metric>')")
    # trials.csv: number, state, value(s), the space's params, then the summary metrics (the first
    # is average_final, `analysis.metrics.summary`'s first number), run_folder, ...
    rest = columns[columns.index(values[-1]) + 1:]
    end = next((i for i, c in enumerate(rest) if c in ("average_final", "run_folder")), len(rest))
    params = rest[:end]
    plots = {p.stem: p for p in sorted((path / "plots").glob("*.png"))} if (path / "plots").is_dir() else {}
    best = (path / "best.yaml").read_text(encoding="utf-8") if (path / "best.yaml").is_file() else None
    return SweepInput(path=path, trials=trials, value_columns=values, param_columns=params, best_yaml=best,
                      pareto=_json_or_none(path / "pareto.json"), plots=plots)


def number(text: str | None) -> float:
    """A CSV cell as a float (NaN when empty)."""
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _yaml_or_empty(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ReportInputError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    return data if isinstance(data, dict) else {}


def _json_or_none(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{path}: not valid JSON ({err})") from None
    return data if isinstance(data, dict) else None


def _json_or_empty(path: Path) -> dict[str, Any]:
    return _json_or_none(path) or {}
