"""Pretraining killed with SIGKILL part-way continues from its last checkpoint to the same base, bit
for bit, as an uninterrupted pretraining (the reference bases take an hour or more: a kill must not
cost more than the steps since the last checkpoint)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cl_platform.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]

# The real CLI, each training step 50 ms slower: room to kill between two checkpoints.
SLOW_CLI = """
import sys, time
from cl_platform.lm_module import LMModule
step = LMModule.training_step
def slow(self, *args, **kwargs):
    time.sleep(0.05)
    return step(self, *args, **kwargs)
LMModule.training_step = slow
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    return out


def saved_step(folder: Path | None) -> int:
    try:
        return load_checkpoint(folder / "last.ckpt", "pretrain")["step"]
    except Exception:  # not written yet, or being replaced right now
        return -1


@pytest.mark.slow
def test_sigkill_mid_pretraining_then_rerun_gives_the_same_base(tiny, tmp_path):
    pretrain = {"steps": 30, "checkpoint_every": 8, "eval_every": 10, "lr": 2e-3}  # a base of its own key
    whole = tiny.config(tmp_path / "whole.yaml", runs_root=str(tmp_path / "whole"), pretrain=pretrain)
    killed = tiny.config(tmp_path / "killed.yaml", runs_root=str(tmp_path / "killed"), pretrain=pretrain)
    reference = start(["pretrain", str(whole)])
    victim = start(["pretrain", str(killed)])
    folder = None
    deadline = time.monotonic() + 240
    while saved_step(folder) < 16:  # two checkpoints in: the kill lands between 16 and 24
        folder = folder or next(iter((tmp_path / "killed").glob("pretrain-*")), None)
        if victim.poll() is not None:
            pytest.fail(f"the pretraining ended before it could be killed: {victim.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail("no second checkpoint within 240 s")
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    finish(reference)
    at = saved_step(folder)
    assert not (folder / "base.ckpt").exists() and 16 <= at < 30

    out = finish(start(["pretrain", str(killed)]))
    assert f"pretraining: continuing from step {at} ({folder / 'last.ckpt'})" in out  # not started over
    a = load_checkpoint(next((tmp_path / "whole").glob("pretrain-*")) / "base.ckpt", "base")
    b = load_checkpoint(folder / "base.ckpt", "base")
    assert a["key"] == b["key"] and a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # fast weights included
    assert a["record"]["final_eval"] == b["record"]["final_eval"]
