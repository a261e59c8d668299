"""A 2-rank `finetune` run (Lightning DDP, gloo, CPU processes) killed with SIGKILL mid-experience
or during an evaluation, continued with --resume, gives the same results as an uninterrupted
2-rank run, bit for bit.

The experience holds an odd number of segments (13), so the last global batch needs padding:
a resume that sharded only the rest of the experience would pad it with another segment than
the uninterrupted run (torch's DistributedSampler pads with the first indices of what it is
given), which is what `streams.datamodule.ResumableSampler` prevents."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cl_platform.results import RunResults

ROOT = Path(__file__).resolve().parents[2]

# The CLI, with a strategy that sleeps 0.2 s per step (room to kill mid-experience) and, when
# CLP_TEST_SLOW_ROW=t, an evaluation of row t that first leaves a marker file and sleeps 3 s
# (room to kill during it). A script file, not `python -c`: Lightning starts rank 1 by
# re-running this command.
SCRIPT = """
import os, sys, time
from pathlib import Path
import strategies
from cl_platform.strategy import Strategy
from cl_platform.engine import ContinualRunner

class Slow(Strategy):
    def after_write(self, ctx):
        time.sleep(0.2)

strategies.STRATEGIES["slow"] = Slow
slow_row = int(os.environ.get("CLP_TEST_SLOW_ROW", "-1"))
evaluate_row = ContinualRunner._evaluate_row

def marked_row(self, t):
    if t == slow_row:
        Path(os.environ["CLP_TEST_MARKS"], f"evaluating-{t}-rank{os.environ.get('LOCAL_RANK', '0')}").touch()
        time.sleep(3)
    evaluate_row(self, t)

ContinualRunner._evaluate_row = marked_row
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(script: Path, args: list[str], **env) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # its own process group


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    return out


def last_curve_step(folder: Path | None) -> int:
    try:
        points = json.loads((folder / "results.json").read_text())["curves"].get("math", [])
    except (TypeError, OSError, ValueError, KeyError):
        return -1
    return points[-1][0] if points else -1


def kill_when(proc: subprocess.Popen, ready) -> None:
    """SIGKILL the whole process group (both ranks) once `ready()` is true."""
    deadline = time.time() + 300  # a polling limit, not a measurement
    while not ready():
        assert proc.poll() is None, proc.communicate()
        if time.time() > deadline:
            pytest.fail("the run never reached the kill point")
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_ddp_finetune_killed_mid_experience_and_during_evaluation_resumes_to_the_same_results(tiny, tmp_path):
    from experiments.base import ensure_base
    from experiments.setup import load_setup

    stream = tiny.write_yaml(tmp_path / "odd.yaml", {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache"),
                                                     "token_budget": {**tiny.stream_spec["token_budget"], "adapt": 416}})
    overrides = dict(stream=str(stream), model={"dropout": 0.1}, strategy={"name": "slow"},
                     cl={"mode": "finetune", "devices": 2, "curve_every": 1, "checkpoint_every": 2})
    # One base for all three runs, built here so that they do not race to pretrain it.
    ensure_base(load_setup(tiny.config(tmp_path / "base.yaml", **overrides)), progress_bar=False, say=lambda _: None)
    script = tmp_path / "slow_cli.py"
    script.write_text(SCRIPT, encoding="utf-8")
    marks = tmp_path / "marks"
    marks.mkdir()

    reference = start(script, ["run", str(tiny.config(tmp_path / "whole.yaml", name="ddp-whole", **overrides))])
    mid = start(script, ["run", str(tiny.config(tmp_path / "mid.yaml", name="ddp-mid", **overrides))])
    # 13 segments, 2 per rank and step: steps 1-4 are experience 1, the checkpoint of step 2 is the
    # last one before the kill at step 3, so the resume streams 5 segments (padding needed).
    kill_when(mid, lambda: last_curve_step(next(iter(tiny.runs.glob("ddp-mid-*")), None)) >= 3)
    in_eval = start(script, ["run", str(tiny.config(tmp_path / "eval.yaml", name="ddp-eval", **overrides))],
                    CLP_TEST_SLOW_ROW="1", CLP_TEST_MARKS=str(marks))
    kill_when(in_eval, lambda: (marks / "evaluating-1-rank0").exists())
    whole_out = finish(reference)

    folders = {name: next(tiny.runs.glob(f"ddp-{name}-*")) for name in ("whole", "mid", "eval")}
    for name in ("mid", "eval"):
        partial = RunResults.from_json(folders[name] / "results.json")
        assert not partial.matrix.is_complete
        resumed_out = finish(start(script, ["run", str(tmp_path / f"{name}.yaml"), "--resume"]))
        assert f"resuming {folders[name]}" in resumed_out
    assert "average forgetting" in whole_out
    whole = RunResults.from_json(folders["whole"] / "results.json")
    assert whole.matrix.is_complete and whole.row_steps == {"0": 0, "1": 4, "2": 8}
    for name in ("mid", "eval"):
        resumed = RunResults.from_json(folders[name] / "results.json")
        assert np.array_equal(resumed.matrix.values, whole.matrix.values), (name, resumed.matrix.values, whole.matrix.values)
        assert resumed.curves == whole.curves, name
        assert resumed.doc_losses == whole.doc_losses and resumed.row_steps == whole.row_steps, name
        resumes = json.loads((folders[name] / "run.json").read_text())["resumes"]
        assert len(resumes) == 1, name
