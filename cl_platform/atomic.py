"""Atomic file writes: the data goes to a temporary file in the same folder, is fsync'ed and
renamed over the target, so a reader — or a run resumed after a kill — sees the old file or the
new one, never half of one. No torch import: `results.py` (read by `analysis/`) uses it."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Callable


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO], None], binary: bool = False) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path: str | os.PathLike[str], data) -> None:
    """`data` as indented JSON (values JSON cannot hold are written as strings)."""
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
