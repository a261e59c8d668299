"""The kill-and-resume harness of the process tests (resume, pretraining kill, DDP resume,
preemption, two nodes): the real `clp`, slowed down so that a test can stop it at a chosen point,
in processes of their own.

    def test_x(tiny, tmp_path, kill_resume):
        victim = kill_resume.start(["run", str(config)])
        kill_resume.kill_when(lambda: kill_resume.curve_step(tiny.runs, "x-*") >= 3, victim)
        out = kill_resume.finish(kill_resume.start(["run", str(config), "--resume"]))

`start` runs `SLOW_CLI` (a file, not `python -c`: Lightning starts a DDP run's other ranks by
re-running the command), with environment variables that set how slow it is:

- CLP_TEST_STEP_SLEEP: seconds the strategy `slow` (the naive strategy, registered under that
  name) sleeps after each write; 0.2 unless set.
- CLP_TEST_PRETRAIN_SLEEP: seconds each pretraining step sleeps; 0 unless set.
- CLP_TEST_SLOW_ROW=t with CLP_TEST_MARKS=folder: the evaluation of row t first leaves the file
  `evaluating-t-rank<LOCAL_RANK>` in the folder and sleeps 3 s (room to kill during it).
- CLP_TEST_SIGTERM_AT_STEP=n: the run sends itself SIGTERM right after the step hooks of its
  step n have run (the signal a scheduler sends at the worst moment, made to come on purpose).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLOW_CLI = """
import os, sys, time
from pathlib import Path
import strategies
from cl_platform.engine import ContinualRunner
from cl_platform.lm_module import LMModule
from cl_platform.strategy import Strategy

step_sleep = float(os.environ.get("CLP_TEST_STEP_SLEEP", "0.2"))
pretrain_sleep = float(os.environ.get("CLP_TEST_PRETRAIN_SLEEP", "0"))
slow_row = int(os.environ.get("CLP_TEST_SLOW_ROW", "-1"))

class Slow(Strategy):
    def after_write(self, ctx):
        time.sleep(step_sleep)

strategies.STRATEGIES["slow"] = Slow
evaluate_row = ContinualRunner._evaluate_row

def marked_row(self, t):
    if t == slow_row:
        Path(os.environ["CLP_TEST_MARKS"], f"evaluating-{t}-rank{os.environ.get('LOCAL_RANK', '0')}").touch()
        time.sleep(3)
    evaluate_row(self, t)

ContinualRunner._evaluate_row = marked_row
training_step = LMModule.training_step

def slow_step(self, *args, **kwargs):
    if self.phase == "pretrain" and pretrain_sleep:
        time.sleep(pretrain_sleep)
    return training_step(self, *args, **kwargs)

LMModule.training_step = slow_step
import signal
from cl_platform.trainer import StepHooks
sigterm_step = int(os.environ.get("CLP_TEST_SIGTERM_AT_STEP", "-1"))
batch_end = StepHooks.on_train_batch_end

def signalled_batch_end(self, trainer, pl_module, *args):
    batch_end(self, trainer, pl_module, *args)
    if pl_module.phase != "pretrain" and pl_module.position.step == sigterm_step:
        os.kill(os.getpid(), signal.SIGTERM)

StepHooks.on_train_batch_end = signalled_batch_end
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""

# What a launcher sets in the processes it starts: a test process started under one (torchrun,
# SLURM) must not pass it on to the runs it starts.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "TORCHELASTIC_RUN_ID")


class KillResume:
    def __init__(self, folder: Path):
        self.script = folder / "slow_cli.py"
        self.script.write_text(SLOW_CLI, encoding="utf-8")
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], launcher: Sequence[str] = (), **env: str) -> subprocess.Popen:
        """`python [LAUNCHER...] slow_cli.py ARGS...` from the repository root, at one OpenMP thread,
        in its own process group (a DDP run's ranks are killed together), outside any launcher's
        environment; stdout and stderr piped. `env`: variables to set (CLP_TEST_*, NODE_RANK, ...)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
        for variable in LAUNCHER_VARIABLES:
            env.pop(variable, None)
        proc = subprocess.Popen([sys.executable, *launcher, str(self.script), *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(proc)
        return proc

    @staticmethod
    def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
        """Its stdout, once it has exited with 0."""
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
        return out

    @staticmethod
    def kill_when(ready, *procs: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 300,
                  what: str = "the kill point") -> list[tuple[str, str]]:
        """Poll `ready()`; once true, send `sig` to each process's group and return each one's
        (stdout, stderr) after it has exited. Fails if a process exits first, or after `timeout` s
        (a polling limit, not a measurement)."""
        deadline = time.monotonic() + timeout
        while not ready():
            for proc in procs:
                if proc.poll() is not None:
                    pytest.fail(f"exited {proc.returncode} before {what}: {proc.communicate()}")
            if time.monotonic() > deadline:
                pytest.fail(f"never reached {what} in {timeout} s")
            time.sleep(0.01)
        for proc in procs:
            os.killpg(proc.pid, sig)
        return [proc.communicate(timeout=600) for proc in procs]

    @staticmethod
    def find(root: Path, pattern: str) -> Path | None:
        """The first folder under `root` matching `pattern`, or None while there is none."""
        return next(iter(root.glob(pattern)), None)

    @staticmethod
    def last_curve_step(folder: Path | None) -> int:
        """The step of the last `math` curve point in the run folder's results.json; -1 while there is none."""
        try:
            points = json.loads((folder / "results.json").read_text())["curves"].get("math", [])
        except (TypeError, OSError, ValueError, KeyError):
            return -1
        return points[-1][0] if points else -1

    def curve_step(self, root: Path, pattern: str) -> int:
        """`last_curve_step` of the first run folder under `root` matching `pattern` (-1 while there is none)."""
        return self.last_curve_step(self.find(root, pattern))

    def close(self) -> None:
        """Kill what a failed test left running (its whole process group)."""
        for proc in self.started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()


@pytest.fixture
def kill_resume(tmp_path):
    """The harness, its script written to this test's tmp_path; processes left running are killed at the end."""
    harness = KillResume(tmp_path)
    yield harness
    harness.close()
