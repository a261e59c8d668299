"""The skeleton every study (`clp recall`, `clp eval`, `clp niah`) is built on.

    exp = load_study(RecallExperiment, path, "recall config", overrides, seeds=[0, 1])
    folder = study_folder(exp.runs_root, "recall", identity)         # <runs_root>/recall-<hash[:12]>
    results = [cached(folder, name, seed, lambda: train(name, seed)) for name, seed in members]
    write_results(folder, {"runs": results, "summary": summary}, table_text)

A study is: a typed config read from YAML with `key=value` overrides (the same checks as the
file), a list of members — one (name, seed) each — whose results are cached one JSON file each in
the study's folder, so that adding a member computes only what is new and a killed study keeps
every finished member; then a summary and a table computed from the members. The folder is keyed
by `cl_platform.config.config_hash` of what determines the members' results (never the YAML's
text: a comment is not a setting), and every file is written atomically.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from cl_platform.atomic import atomic_write_json, atomic_write_text
from cl_platform.check import ConfigError, apply_overrides, from_mapping, read_yaml
from cl_platform.config import config_hash
from experiments.config_files import keep_named


def load_study(cls: type, path: str | Path, what: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
               subset: tuple[str, Sequence[str] | None, str] | None = None) -> Any:
    """Dataclass `cls` from the YAML file `path` (a `what`, for messages): file, then `key=value`
    overrides, then `seeds` (the `--seeds` sugar), then `subset` = (field, names, flag) keeping
    only those entries of a mapping field (`--variants a,b`); every error names the file."""
    path = Path(path)
    data = apply_overrides(read_yaml(path, what), overrides, what)
    if seeds is not None:
        data["seeds"] = seeds
    if subset is not None:
        keep_named(data, *subset, path)
    return from_mapping(cls, data, f"{what} {path}", whole_file=True)


def study_folder(runs_root: str | Path, prefix: str, identity: dict[str, Any]) -> Path:
    """`<runs_root>/<prefix>-<config_hash(identity)[:12]>`: one folder per setting of a study."""
    return Path(runs_root) / f"{prefix}-{config_hash(identity)[:12]}"


def cached(folder: Path, name: str, seed: int, compute: Callable[[], dict[str, Any]],
           fresh: Callable[[dict[str, Any]], bool] = lambda result: True) -> dict[str, Any]:
    """Member (name, seed)'s result: read from `<folder>/<name>-seed<seed>.json` if it is there
    and `fresh(result)` (e.g. made from the same base), else computed and written atomically."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-seed{seed}.json"
    if path.is_file():
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            result = None  # unreadable (written by hand?): computed again
        if result is not None and fresh(result):
            return result
    result = compute()
    atomic_write_json(path, result)
    return result


def write_results(folder: Path, results: dict[str, Any], table: str) -> None:
    """The study's outputs, rebuilt from its members at every run: results.json and table.txt."""
    atomic_write_json(folder / "results.json", results)
    atomic_write_text(folder / "table.txt", table + "\n")
