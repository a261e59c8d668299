"""Helpers for the config files every command reads (run, comparison, sweep and study files):
the `--seeds 0,1,2` sugar, `--entries a,b`-style subsets of a file's mapping, and paths a file
names, resolved as a run config's are.

    parse_seeds("0,1,2", "--seeds")                        # [0, 1, 2]
    keep_named(data, "entries", ["naive"], "--entries", path)
    relative_to("compare.yaml", "default.yaml", "run", overrides)   # beside the file, or the cwd's

Here rather than in `studies/`: `multi/` and the command line use them, and import no study.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from cl_platform.check import ConfigError


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


def relative_to(path: str | Path, value: str, key: str | None = None, overrides: Sequence[str] = ()) -> str:
    """`value`, a path of the config file `path`, resolved against that file's folder; when the
    command line set it (`key=...` among `overrides`), against the working directory, as a run
    config's paths are (cl_platform/config.py)."""
    if Path(value).is_absolute():
        return value
    on_cli = key is not None and any(str(o).partition("=")[0].strip() == key for o in overrides)
    return str((Path.cwd() if on_cli else Path(path).parent) / value)
