"""The one-writer lock: refused while a live process holds it (naming it), free once that process
is killed (taken over, naming the dead holder), waited for on request."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cl_platform.file_lock import FileLock, FolderBusy

ROOT = Path(__file__).resolve().parents[2]

# Holds the lock, says so by creating READY, then keeps it until GO exists (or it is killed).
HOLDER = """
import os, sys, time
from pathlib import Path
from cl_platform.file_lock import FileLock
lock = FileLock(sys.argv[1], "thing").acquire()
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.02)
lock.release()
"""


def holder(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    lock, ready, go = tmp_path / "x.lock", tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(ready), str(go)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 60
    while not ready.exists():
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail(f"the holder did not take the lock (exit {proc.poll()})")
        time.sleep(0.02)
    return proc, lock, go


def test_a_held_lock_is_refused_naming_the_holder_and_taken_over_once_it_is_killed(tmp_path):
    proc, path, _ = holder(tmp_path)
    try:
        with pytest.raises(FolderBusy) as err:
            FileLock(path, "the thing").acquire()
        message = str(err.value)
        assert f"the thing is in use by pid {proc.pid} on {socket.gethostname()}" in message
        assert str(path) in message and "\n" not in message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    notes = []
    lock = FileLock(path, "the thing", on_takeover=notes.append).acquire()
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"the thing: took over the lock left by pid {proc.pid} on {socket.gethostname()} since ")
    assert notes[0].endswith(", which is no longer running")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    with pytest.raises(RuntimeError):
        lock.acquire()  # one object, one hold
    lock.release()
    assert path.read_text() == ""
    with FileLock(path, "the thing", on_takeover=notes.append):  # released cleanly: nothing to take over
        assert len(notes) == 1


def test_wait_blocks_until_the_holder_releases(tmp_path):
    proc, path, go = holder(tmp_path)
    heard = []

    def on_wait(line):  # told whom it waits for, then lets the holder go
        heard.append(line)
        go.touch()

    with FileLock(path, "the thing", wait=True, on_wait=on_wait) as lock:
        assert proc.wait(timeout=60) == 0  # the holder released and ended first
        assert json.loads(path.read_text())["pid"] == os.getpid() and lock.handle is not None
    assert len(heard) == 1 and f"in use by pid {proc.pid}" in heard[0] and heard[0].endswith("waiting for it")


def test_the_lock_is_per_open_file_so_a_second_holder_in_one_process_is_refused_too(tmp_path):
    """flock, not POSIX record locks: those are per process, so a second `clp` function call in
    the same process (a sweep worker running two trials) would get the lock it already holds."""
    with FileLock(tmp_path / "x.lock", "the thing"):
        with pytest.raises(FolderBusy):
            FileLock(tmp_path / "x.lock", "the thing").acquire()
