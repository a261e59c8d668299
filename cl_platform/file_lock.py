"""One writer per folder: an advisory lock on a file, held by the process that writes the folder.

    with FileLock(run_dir / "run.lock", f"run folder {run_dir}"):        # refuses if held
        ...
    with FileLock(runs_root / ".pretrain-1a2b.lock", "base", wait=True, on_wait=print):  # waits
        ...

`fcntl.flock` on an open file: the kernel releases it when the holder's process ends, however it
ends (SIGKILL included), so a lock left by a dead process is simply free — it is taken over
without a prompt, with a note naming the process that left it. While held, the file holds the
holder's pid, host, start time and command (JSON), so a refusal says who to wait for; it is
emptied on a clean release. The file itself is never deleted: deleting a lock file lets a second
process lock a new file of the same name while a third still holds the old one.

flock works between processes of one machine, and on NFS (Linux emulates it with byte-range
locks there); two machines that do not share the file system do not see each other's locks.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable


class FolderBusy(RuntimeError):
    """Another live process holds the lock."""


class FileLock:
    def __init__(self, path: str | os.PathLike[str], what: str, wait: bool = False,
                 on_wait: Callable[[str], None] | None = None, on_takeover: Callable[[str], None] | None = None):
        """`what`: the thing locked, in words (for messages). `wait`: block until the holder is
        done (`on_wait` hears once whom it waits for) instead of raising FolderBusy.
        `on_takeover` hears about a lock left behind by a process that died holding it."""
        self.path = Path(path)
        self.what, self.wait = what, wait
        self.on_wait, self.on_takeover = on_wait, on_takeover
        self.handle = None

    def acquire(self) -> "FileLock":
        if self.handle is not None:
            raise RuntimeError(f"{self.path} is already held by this lock object")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # never truncate before holding it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe(read_holder(self.path))
            if not self.wait:
                handle.close()
                raise FolderBusy(f"{self.what} is in use by {holder}; wait for it to finish or stop it "
                                 f"(lock file {self.path})") from None
            if self.on_wait is not None:
                self.on_wait(f"{self.what} is in use by {holder}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except BaseException:
            handle.close()
            raise
        left = read_holder(self.path)
        if left and self.on_takeover is not None:
            # Held now, yet it names a holder: that process died without releasing it.
            self.on_takeover(f"{self.what}: took over the lock left by {describe(left)}, which is no longer running")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder_record()) + "\n")
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        try:
            handle.seek(0)
            handle.truncate()  # an empty file: nobody holds it, and nobody died holding it
            handle.flush()
        except OSError:
            pass  # the lock is released with the file below, whatever its contents
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def holder_record() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)[:300]}


def read_holder(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('since', '?')} "
            f"({holder.get('command', '?')})")
