"""Atomic writes: the mode a new file gets from the umask, one error naming the file for any
failure to write (a full disk as torch.save reports it included), the previous file kept, and
the last.ckpt / prev.ckpt rotation with its fallback."""
import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cl_platform.atomic import WriteError, atomic_write, atomic_write_text
from cl_platform.checkpoint import CheckpointError, latest_checkpoint, load_latest, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_gets_the_mode_open_would_give_it(tmp_path, umask, expected):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.txt", "text")
        atomic_write(tmp_path / "b.bin", lambda f: f.write(b"\0"), binary=True)
        (tmp_path / "plain.txt").write_text("for comparison")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a.txt") == mode(tmp_path / "b.bin") == mode(tmp_path / "plain.txt") == expected


class FullDisk:
    """A file whose writes fail after `room` bytes, as on a full disk."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data):
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_failed_write_names_the_file_and_keeps_the_previous_one(tmp_path):
    path = tmp_path / "results.json"
    atomic_write_text(path, "old")
    with pytest.raises(WriteError) as err:
        atomic_write(path, lambda f: FullDisk(f, 2).write("new text"))
    assert str(err.value).startswith(f"cannot write {path}: No space left on device; ")
    assert str(err.value).endswith("free on its file system; the previous version is unchanged")
    assert err.value.errno == errno.ENOSPC and path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left
    with pytest.raises(WriteError, match="nothing was written"):
        atomic_write(tmp_path / "new.json", lambda f: FullDisk(f, 0).write("x"))
    with pytest.raises(WriteError, match="No such file or directory"):
        atomic_write_text(tmp_path / "missing" / "x.json", "x")


# torch.save into a real file whose size the kernel caps (RLIMIT_FSIZE: write() fails with EFBIG):
# torch reports it as "RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos", the
# OS error only its context. A process of its own: the limit is per process.
CAPPED = """
import resource, signal, sys, torch
from cl_platform.atomic import WriteError, atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
try:
    atomic_write(sys.argv[1], lambda f: torch.save({"w": torch.zeros(100_000)}, f), binary=True)
except WriteError as err:
    print(type(err.__context__).__name__ if err.__context__ else "-", err.errno, err)
"""


def test_torch_saves_wrapped_os_error_becomes_a_write_error(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"previous")
    out = subprocess.run([sys.executable, "-c", CAPPED, str(path)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the error caught was torch's RuntimeError, the OS error found behind it
    assert out.stdout.startswith(f"RuntimeError {errno.EFBIG} cannot write {path}: File too large"), out.stdout
    assert path.read_bytes() == b"previous" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def save(path: Path, step: int) -> None:
    save_checkpoint(path, "run", {"d": 1}, {"step": step}, keep_previous=True)


def test_rotation_keeps_the_previous_checkpoint_and_a_failed_save_changes_neither(tmp_path, monkeypatch):
    last, prev = tmp_path / "last.ckpt", tmp_path / "prev.ckpt"
    save(last, 1)
    assert not prev.exists()
    save(last, 2)
    save(last, 3)
    assert (torch.load(last)["step"], torch.load(prev)["step"]) == (3, 2)
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, f: real(obj, FullDisk(f, 100)))
    with pytest.raises(WriteError):
        save(last, 4)
    monkeypatch.undo()
    assert (torch.load(last)["step"], torch.load(prev)["step"]) == (3, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "prev.ckpt"]


def test_load_latest_falls_back_to_the_previous_checkpoint_only_when_the_newest_is_unreadable(tmp_path):
    last, prev = tmp_path / "last.ckpt", tmp_path / "prev.ckpt"
    save(last, 1)
    save(last, 2)
    said = []
    assert load_latest(last, "run", {"d": 1}, say=said.append)[0]["step"] == 2 and said == []
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3])
    loaded, used = load_latest(last, "run", {"d": 1}, say=said.append)
    assert (loaded["step"], used) == (1, prev)
    assert not last.exists() and (tmp_path / "last.ckpt.unreadable").is_file()  # the next save keeps prev.ckpt
    assert len(said) == 1 and f"checkpoint {last} cannot be read" in said[0] and f"from the previous checkpoint {prev}" in said[0]
    with pytest.raises(CheckpointError, match="different model config"):  # not a reason to fall back
        save(last, 3)
        load_latest(last, "run", {"d": 2}, say=said.append)
    prev.write_bytes(b"garbage")
    last.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="and the previous one"):
        load_latest(last, "run", {"d": 1}, say=said.append)
    last.unlink()  # stopped between the two renames of a rotation: only prev.ckpt
    save_checkpoint(prev, "run", {"d": 1}, {"step": 7})
    assert latest_checkpoint(last) == prev
    loaded, used = load_latest(last, "run", {"d": 1}, say=said.append)
    assert (loaded["step"], used) == (7, prev) and "is missing" in said[-1]
    prev.unlink()
    assert latest_checkpoint(last) is None
