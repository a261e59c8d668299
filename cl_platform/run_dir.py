"""Run folders: what `runs/<name>-<hash[:12]>/` holds before, during and after a run, and the
decision what to do with one (docs/protocol.md, "The run folder").

    state, ckpt = inspect_run_dir(folder, config_hash, identity, resume)  # "new" / "resume" / "complete"
    create_run_dir(folder, config_hash, identity, resolved_yaml, record)  # config.yaml + run.json
    record_resume(folder, {...})                   # run.json `resumes`: who continued the run, where
    update_run_json(folder, lambda meta: ...)      # edit run.json in place, atomically

A folder is identified by its run.json's `identity` (the resolved fields that make two runs the
same run): a folder of another configuration is refused with the differences, never overwritten.
One process at a time runs a folder: `run.lock` (`LOCK`, cl_platform.file_lock) is taken by the
caller (experiments/run.py) before it looks at the folder, and a folder holding only that file is
a folder with nothing in it yet. The resumable checkpoint is `CHECKPOINT` under the folder
(cl_platform.checkpoint: `last.ckpt` + `prev.ckpt`); the runner (cl_platform.engine) writes it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from cl_platform.atomic import atomic_write_json
from cl_platform.checkpoint import latest_checkpoint
from cl_platform.config import dict_diff
from cl_platform.results import RunResults

CHECKPOINT = Path("checkpoints") / "last.ckpt"
LOCK = "run.lock"


class RunDirError(RuntimeError):
    """The run folder cannot be used as asked (exists, differs, nothing to resume); nothing was written."""


def inspect_run_dir(run_dir: str | os.PathLike[str], config_hash: str, identity: dict[str, Any],
                    resume: bool) -> tuple[str, Path | None]:
    """Decide what to do with a run folder; reads only.

    Returns ("new", None): nothing there yet (with `resume` too: a run killed while its base was
    pretraining has no folder yet, and the pretraining continues from its own checkpoint);
    ("resume", checkpoint, or None to start over in the same folder); ("complete", None).
    Raises RunDirError for a folder of another configuration or an unfinished run without resume.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists() or {p.name for p in run_dir.iterdir()} <= {LOCK}:
        return "new", None
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        stored = meta["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RunDirError(f"{run_dir} exists but is not a run folder (no readable run.json); "
                          f"choose another folder or delete it") from None
    current = _as_json(identity)
    if stored != current:
        diffs = dict_diff(stored, current)
        more = f"\n  ... {len(diffs) - 20} more" if len(diffs) > 20 else ""
        raise RunDirError(
            f"{run_dir} holds a run of a different configuration (hash {meta.get('config_hash', '?')[:12]}, "
            f"this config {config_hash[:12]}); nothing was changed. Differences (stored → this config):\n  "
            + "\n  ".join(diffs[:20]) + more
        )
    results = run_dir / "results.json"
    if results.is_file():
        try:
            if RunResults.from_json(results).matrix.is_complete:
                return "complete", None
        except ValueError:
            pass  # unreadable: the checkpoint holds the results too
    if not resume:
        raise RunDirError(f"{run_dir} holds an unfinished run; continue it with --resume "
                          f"(or delete the folder to start over)")
    return "resume", latest_checkpoint(run_dir / CHECKPOINT)


def create_run_dir(run_dir: str | os.PathLike[str], config_hash: str, identity: dict[str, Any], resolved_yaml: str,
                   record: dict[str, Any] | None = None) -> None:
    """A new run folder with its resolved config (config.yaml) and identity (run.json); `record`:
    more for run.json (provenance: code, versions, machine, the base)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(resolved_yaml, encoding="utf-8")
    atomic_write_json(run_dir / "run.json", {"config_hash": config_hash, "identity": _as_json(identity),
                                             "command": sys.argv, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                                             **_as_json(record or {})})


def record_resume(run_dir: str | os.PathLike[str], entry: dict[str, Any]) -> None:
    """Append to run.json's `resumes` (the command, time and provenance of a process that
    continues the run: it may run other code or on another machine than the one that began it)."""
    entry = {"command": sys.argv, "at": time.strftime("%Y-%m-%d %H:%M:%S"), **_as_json(entry)}
    update_run_json(run_dir, lambda meta: meta.setdefault("resumes", []).append(entry))


def update_run_json(run_dir: str | os.PathLike[str], change: Callable[[dict[str, Any]], None]) -> None:
    """Read run.json (empty if there is none: a runner used outside `create_run_dir`), let
    `change` edit it in place, write it back atomically."""
    path = Path(run_dir) / "run.json"
    meta = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    change(meta)
    atomic_write_json(path, meta)


def _as_json(data: Any) -> Any:
    return json.loads(json.dumps(data, default=str))
