"""Atomic file writes: the data goes to a temporary file in the same folder, is fsync'ed and
renamed over the target, so a reader — or a run resumed after a kill — sees the old file or the
new one, never half of one. No torch import: `results.py` (read by `analysis/`) uses it.

Two things a plain `tempfile.mkstemp` gets wrong for files people share:
- its mode is 0600; the file is given the mode `open()` would give a new file (0666 less the
  umask: 0644 under the usual 022), so a report or a checkpoint is readable by the group and a web
  server like the config.yaml beside it;
- a full disk (or any OS error) while writing surfaces from `torch.save` as an opaque
  `RuntimeError ... unexpected pos`; every failure to write is raised as `WriteError`, which names
  the file, the OS's reason and the free space, and says that the previous file is untouched.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable


class WriteError(OSError):
    """A file could not be written; the previous version of it (if any) is unchanged."""

    def __str__(self) -> str:  # the message alone: it is printed as one line by `clp`
        return str(self.strerror)


def new_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0666 less the process's umask."""
    umask = None
    try:  # Linux ≥ 4.7 reports the umask without changing it (changing it is not thread-safe)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                umask = int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    if umask is None:
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO], None], binary: bool = False,
                 keep_previous: str | os.PathLike[str] | None = None) -> None:
    """`write(f)` fills the new file. `keep_previous`: once the new file is complete, the file it
    replaces is renamed there first (between the two renames only `keep_previous` exists)."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise _write_error(path, err) from None
    try:
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        cause = _os_error(err)
        if cause is not None and not isinstance(err, WriteError):
            raise _write_error(path, cause) from None
        raise


def _os_error(err: BaseException) -> OSError | None:
    """The OSError behind `err` (torch's zip writer wraps the file's own error in a RuntimeError
    and keeps it only as the context)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _write_error(path: Path, err: OSError) -> WriteError:
    reason = err.strerror or str(err) or type(err).__name__
    try:
        free = f"; {_size(shutil.disk_usage(path.parent).free)} free on its file system"
    except OSError:
        free = ""
    kept = "the previous version is unchanged" if path.exists() else "nothing was written"
    out = WriteError(err.errno, f"cannot write {path}: {reason}{free}; {kept}")
    out.filename = str(path)
    return out


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path: str | os.PathLike[str], data) -> None:
    """`data` as indented JSON (values JSON cannot hold are written as strings)."""
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
