"""The faults a shared research machine sees, through the real `clp` in real processes: a second
writer on a run folder, two runs needing one uncached base, a full disk while checkpointing, a
damaged newest checkpoint, and the modes of the files a run writes. After each, the run ends with
the same results as an uninterrupted one, bit for bit."""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cl_platform.checkpoint import load_checkpoint
from cl_platform.results import RunResults

ROOT = Path(__file__).resolve().parents[2]

# The naive strategy (same run identity), but the process stops at run step 4 and waits there
# until it is killed, after writing CLP_TEST_MARK: a run that is "still running" on cue.
HANG_CLI = """
import os, sys, time
import strategies
from strategies.naive import NaiveStrategy

class Hang(NaiveStrategy):
    def after_write(self, ctx):
        if ctx.global_step == 4:
            open(os.environ["CLP_TEST_MARK"], "w").close()
            time.sleep(600)

strategies.STRATEGIES["naive"] = Hang
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""

# A disk that fills up: the first CLP_TEST_CKPT_OK checkpoints fit; in every later one the file's
# writes fail after 4 KiB as a full disk's do (OSError ENOSPC from write()).
FULL_DISK_CLI = """
import errno, os, sys
import torch

left = int(os.environ["CLP_TEST_CKPT_OK"])
real_save = torch.save

class FullDisk:
    def __init__(self, f):
        self.f, self.written = f, 0
    def write(self, data):
        self.written += len(data)
        if self.written > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)
    def __getattr__(self, name):
        return getattr(self.f, name)

def save(obj, f, *args, **kwargs):
    global left
    left -= 1
    return real_save(obj, f if left >= 0 else FullDisk(f), *args, **kwargs)

torch.save = save
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""

# The naive strategy, crashing once after the checkpoint of step 9 (checkpoint_every 3).
CRASH_CLI = """
import sys
import strategies
from strategies.naive import NaiveStrategy

class Crash(NaiveStrategy):
    def after_write(self, ctx):
        if ctx.global_step == 10:
            raise SystemExit("crash for the test")

strategies.STRATEGIES["naive"] = Crash
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""

# Pretraining that waits, holding the base's lock, until CLP_TEST_GO exists.
SLOW_PRETRAIN_CLI = """
import os, sys, time
import cl_platform.pretrain as pretrain

run = pretrain.Pretrainer.run
def gated(self):
    deadline = time.time() + 120
    while not os.path.exists(os.environ["CLP_TEST_GO"]) and time.time() < deadline:
        time.sleep(0.05)
    return run(self)

pretrain.Pretrainer.run = gated
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def env(**extra) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1", **extra}


def start(args: list[str], script: str, log: Path, **extra) -> subprocess.Popen:
    code = script or "import sys\nfrom experiments.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env(**extra), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, text=True, umask=0o022)


def clp(args: list[str], script: str | None = None, **extra) -> subprocess.CompletedProcess:
    code = script or "import sys\nfrom experiments.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env(**extra), capture_output=True,
                          text=True, timeout=300, umask=0o022)


def poll(done, proc: subprocess.Popen, log: Path, what: str, timeout: float = 180) -> None:
    """Wait until `done()`, failing if `proc` exits first (or after `timeout` s: a hung process)."""
    deadline = time.time() + timeout
    while not done():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        if time.time() > deadline:
            pytest.fail(f"no {what} after {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def one_error_line(proc: subprocess.CompletedProcess, command: str = "run") -> str:
    """The process failed as a user error: exit 2, no traceback, its last line the error."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"clp {command}: error: "), proc.stderr[-3000:]
    return lines[-1]


def same_results(a: Path, b: Path) -> None:
    ra, rb = RunResults.from_json(a / "results.json"), RunResults.from_json(b / "results.json")
    assert ra.matrix.is_complete and rb.matrix.is_complete
    assert np.array_equal(ra.matrix.values, rb.matrix.values), (ra.matrix.values, rb.matrix.values)
    assert ra.curves == rb.curves and ra.doc_losses == rb.doc_losses


@pytest.fixture(scope="module")
def reference(tiny, tiny_base, tmp_path_factory):
    """An uninterrupted naive run of the tiny config (made under umask 022)."""
    path = tiny.config(tmp_path_factory.mktemp("faults") / "run.yaml")
    folder = tmp_path_factory.mktemp("faults-ref") / "whole"
    proc = clp(["run", str(path), "--run-dir", str(folder)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return path, folder


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_runs_and_allowed_after_it_is_killed(reference, tmp_path):
    path, whole = reference
    folder, mark, log = tmp_path / "run", tmp_path / "at-step-4", tmp_path / "first.log"
    first = start(["run", str(path), "--run-dir", str(folder)], HANG_CLI, log, CLP_TEST_MARK=str(mark))
    try:
        poll(mark.exists, first, log, "step 4")
        before = json.loads((folder / "run.json").read_text())
        second = clp(["run", str(path), "--run-dir", str(folder), "--resume"])
        line = one_error_line(second)
        assert f"run folder {folder} is in use by pid {first.pid} on {socket.gethostname()}" in line, line
        assert json.loads((folder / "run.json").read_text()) == before  # the refused one wrote nothing
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = clp(["run", str(path), "--run-dir", str(folder), "--resume"])
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"took over the lock left by pid {first.pid}" in third.stdout
    assert f"resuming {folder}" in third.stdout
    assert len(json.loads((folder / "run.json").read_text())["resumes"]) == 1
    assert (folder / "run.lock").read_text() == ""  # released cleanly: nobody holds it, nobody died holding it
    same_results(whole, folder)


@pytest.mark.slow
def test_two_processes_needing_one_uncached_base_pretrain_it_once(tiny, tmp_path):
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "base.yaml", runs_root=str(runs), pretrain={"steps": 20})
    go, log_a, log_b = tmp_path / "go", tmp_path / "a.log", tmp_path / "b.log"
    a = start(["pretrain", str(path)], SLOW_PRETRAIN_CLI, log_a, CLP_TEST_GO=str(go))
    b = None
    try:
        def held() -> bool:  # a holds the base's lock, before pretraining
            return any(p.read_text() for p in runs.glob(".pretrain-*.lock"))

        poll(held, a, log_a, "the base's lock")
        lock = next(runs.glob(".pretrain-*.lock"))
        b = start(["pretrain", str(path)], "", log_b)
        poll(lambda: "waiting for it" in log_b.read_text(), b, log_b, "waiting")
        go.touch()
        assert a.wait(timeout=300) == 0 and b.wait(timeout=300) == 0, (log_a.read_text()[-3000:], log_b.read_text()[-3000:])
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    out_a, out_b = log_a.read_text(), log_b.read_text()
    assert f"is in use by pid {a.pid}" in out_b
    assert "base model: pretraining 20 steps" in out_a and "base model: pretraining" not in out_b
    assert "base model: cached" in out_b
    base = lock.stem.lstrip(".")
    assert [p.name for p in runs.iterdir() if p.is_dir()] == [base]
    events = [p.name for p in (runs / base / "tensorboard").glob("events.*")]
    assert events and all(f".{a.pid}." in name for name in events), events  # only a wrote the pretraining's curves


@pytest.mark.slow
def test_a_full_disk_stops_with_one_line_keeps_the_last_checkpoint_and_resume_equals_an_uninterrupted_run(
        reference, tmp_path):
    path, whole = reference
    folder = tmp_path / "run"
    # Checkpoints: after row 0, steps 3, 6 (= the end of experience 1 and its row), 9, ...: the third fails.
    full = clp(["run", str(path), "--run-dir", str(folder)], FULL_DISK_CLI, CLP_TEST_CKPT_OK="2")
    line = one_error_line(full)
    last = folder / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(last, "run")["position"]["step"]
    assert f"cannot write {last}: No space left on device" in line and "the previous version is unchanged" in line
    assert f"last good checkpoint: {last} (step {saved}), intact" in line and "--resume" in line, line
    assert saved == 3
    assert not list(folder.rglob("*.tmp"))  # the failed write left no half file
    resumed = clp(["run", str(path), "--run-dir", str(folder), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_results(whole, folder)


@pytest.mark.slow
def test_a_corrupted_last_checkpoint_falls_back_to_the_previous_one_and_resume_equals_an_uninterrupted_run(
        reference, tmp_path):
    path, whole = reference
    folder = tmp_path / "run"
    crashed = clp(["run", str(path), "--run-dir", str(folder)], CRASH_CLI)
    assert crashed.returncode != 0 and "crash for the test" in crashed.stderr
    last, prev = folder / "checkpoints" / "last.ckpt", folder / "checkpoints" / "prev.ckpt"
    steps = load_checkpoint(last, "run")["position"]["step"], load_checkpoint(prev, "run")["position"]["step"]
    assert steps[0] == 9 and steps[1] < 9, steps  # the newest and the one before it
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])  # truncated, as by a bad copy
    # Keeping both checkpoints at the end (a reporting setting: the same run) lets the last line
    # check what became of the previous one.
    resumed = clp(["run", str(path), "cl.keep_checkpoints=all", "--run-dir", str(folder), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"checkpoint {last} cannot be read" in resumed.stdout
    assert f"continuing from the previous checkpoint {prev}" in resumed.stdout
    assert f"resuming {folder} from {prev}" in resumed.stdout
    same_results(whole, folder)
    # The unreadable file was moved aside, not rotated into the previous checkpoint.
    assert (folder / "checkpoints" / "last.ckpt.unreadable").read_bytes() == data[: len(data) // 2]
    assert load_checkpoint(prev, "run")["position"]["step"] >= steps[1]


@pytest.mark.slow
def test_every_file_a_run_and_its_report_write_is_0644_under_umask_022(reference):
    path, whole = reference
    proc = clp(["report", str(whole)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = [p for p in whole.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    # A finished run keeps its final checkpoint alone (cl.keep_checkpoints: final); prev.ckpt, while
    # it existed, was last.ckpt renamed, with its mode.
    assert {"last.ckpt", "results.json", "run.json", "config.yaml", "report.html"} <= names, names
    assert "prev.ckpt" not in names
    assert any(n.startswith("events.") for n in names)
    modes = {str(p.relative_to(whole)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes
