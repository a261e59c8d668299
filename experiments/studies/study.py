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


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """'0,1,2' → [0, 1, 2]; empty lists, non-integers and repeats are errors naming the flag."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"{flag}: empty seed list; give comma-separated ints, e.g. {flag} 0,1,2")
    try:
        seeds = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: not a comma-separated list of ints") from None
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"{flag} {text!r}: seed(s) {repeated} repeated; a repeat would only copy a run")
    return seeds


def keep_named(data: dict, field: str, names: Sequence[str] | None, flag: str, path) -> None:
    """Keep only `names` (in that order) of the mapping `data[field]`, for a `--<flag> a,b` subset
    of a config file's entries; a name the file lacks is an error naming the flag and the file."""
    if names is None:
        return
    known = data.get(field) or {}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"{path}: {flag} {unknown} not among the file's {field} {list(known)}")
    data[field] = {n: known[n] for n in names}


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


def relative_to(path: str | Path, value: str, key: str | None = None, overrides: Sequence[str] = ()) -> str:
    """`value`, a path of the config file `path`, resolved against that file's folder; when the
    command line set it (`key=...` among `overrides`), against the working directory, as a run
    config's paths are (cl_platform/config.py)."""
    if Path(value).is_absolute():
        return value
    on_cli = key is not None and any(str(o).partition("=")[0].strip() == key for o in overrides)
    return str((Path.cwd() if on_cli else Path(path).parent) / value)


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
