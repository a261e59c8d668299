"""A run killed with SIGKILL in the middle of an experience, continued with --resume, gives the same
results matrix and curves as an uninterrupted run: exactly, bit for bit."""
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_platform.checkpoint import load_checkpoint
from cl_platform.results import RunResults

# The slow strategy (tests/experiments/conftest.py), every step 50 ms longer: room to kill mid-experience.
FAST_STEPS = {"CLP_TEST_STEP_SLEEP": "0.05"}


def tb_curve(folder: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "finetune"])
def test_sigkill_mid_experience_then_resume_gives_the_same_matrix(tiny, tmp_path, kill_resume, mode):
    model = {"dropout": 0.1} if mode == "finetune" else {}  # finetune: randomness must resume too
    overrides = dict(model=model, strategy={"name": "slow"},
                     cl={"mode": mode, "curve_every": 1, "checkpoint_every": 2})
    if model:
        from experiments.base import resolve_base
        from experiments.setup import load_setup

        resolve_base(load_setup(tiny.config(tmp_path / "base.yaml", **overrides)), progress_bar=False, say=lambda _: None)
    whole = tiny.config(tmp_path / "whole.yaml", name=f"whole-{mode}", **overrides)
    killed = tiny.config(tmp_path / "killed.yaml", name=f"killed-{mode}", **overrides)

    reference = kill_resume.start(["run", str(whole)], **FAST_STEPS)
    victim = kill_resume.start(["run", str(killed)], **FAST_STEPS)
    # experience 2 (steps 7-12) is under way
    kill_resume.kill_when(lambda: kill_resume.curve_step(tiny.runs, f"killed-{mode}-*") >= 9, victim, timeout=120)
    reference_out = kill_resume.finish(reference)
    folder = next(tiny.runs.glob(f"killed-{mode}-*"))

    partial = RunResults.from_json(folder / "results.json")
    assert not partial.matrix.is_complete and partial.matrix.last_complete_row == 1
    position = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")["position"]
    assert position["started"] and position["step"] >= 8 and position["segments_done"] > 0

    resumed_out = kill_resume.finish(kill_resume.start(["run", str(killed), "--resume"], **FAST_STEPS))
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
