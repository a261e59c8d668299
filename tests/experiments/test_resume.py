"""A run killed with SIGKILL in the middle of an experience, continued with --resume, gives the same
results matrix and curves as an uninterrupted run: exactly, bit for bit."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_platform.checkpoint import load_checkpoint
from cl_platform.results import RunResults

ROOT = Path(__file__).resolve().parents[2]

# Same as the naive strategy, but every step takes 50 ms longer: room to kill mid-experience.
SLOW_CLI = """
import sys, time
import strategies
from cl_platform.strategy import Strategy

class Slow(Strategy):
    def after_write(self, ctx):
        time.sleep(0.05)

strategies.STRATEGIES["slow"] = Slow
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    return out


def curve_steps(folder: Path) -> int:
    try:
        data = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError):
        return -1
    points = data["curves"].get("math", [])
    return points[-1][0] if points else -1


def tb_curve(folder: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "finetune"])
def test_sigkill_mid_experience_then_resume_gives_the_same_matrix(tiny, tmp_path, mode):
    model = {"dropout": 0.1} if mode == "finetune" else {}  # finetune: randomness must resume too
    overrides = dict(model=model, strategy={"name": "slow"},
                     cl={"mode": mode, "curve_every": 1, "checkpoint_every": 2})
    if model:
        from experiments.base import ensure_base
        from experiments.setup import load_setup

        ensure_base(load_setup(tiny.config(tmp_path / "base.yaml", **overrides)), progress_bar=False, say=lambda _: None)
    whole = tiny.config(tmp_path / "whole.yaml", name=f"whole-{mode}", **overrides)
    killed = tiny.config(tmp_path / "killed.yaml", name=f"killed-{mode}", **overrides)

    reference = start(["run", str(whole)])
    victim = start(["run", str(killed)])
    folder = None
    deadline = time.time() + 120
    while time.time() < deadline:
        folder = folder or next(iter(tiny.runs.glob(f"killed-{mode}-*")), None)
        if folder is not None and curve_steps(folder) >= 9:  # experience 2 (steps 7-12) is under way
            break
        assert victim.poll() is None, victim.communicate()
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    reference_out = finish(reference)

    partial = RunResults.from_json(folder / "results.json")
    assert not partial.matrix.is_complete and partial.matrix.last_complete_row == 1
    position = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")["position"]
    assert position["started"] and position["step"] >= 8 and position["segments_done"] > 0

    resumed_out = finish(start(["run", str(killed), "--resume"]))
    assert f"resuming {folder}" in resumed_out
    whole_folder = next(tiny.runs.glob(f"whole-{mode}-*"))
    assert whole_folder.name.split("-")[-1] == folder.name.split("-")[-1]  # same config hash
    a = RunResults.from_json(whole_folder / "results.json")
    b = RunResults.from_json(folder / "results.json")
    assert a.matrix.is_complete
    assert np.array_equal(a.matrix.values, b.matrix.values), (a.matrix.values, b.matrix.values)
    assert a.curves == b.curves
    assert a.doc_losses == b.doc_losses and a.row_steps == b.row_steps  # rows from before the kill too
    assert sorted(a.doc_losses, key=int) == [str(t) for t in range(a.matrix.values.shape[0])]
    # TensorBoard: the points logged after the checkpoint and before the kill are superseded.
    for tag in ("eval/math/loss", "eval/code/loss", "train/lm"):
        assert tb_curve(whole_folder, tag) == tb_curve(folder, tag), tag
    assert "average forgetting" in reference_out
