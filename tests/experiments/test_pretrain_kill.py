"""Pretraining killed with SIGKILL part-way continues from its last checkpoint to the same base, bit
for bit, as an uninterrupted pretraining (the reference bases take an hour or more: a kill must not
cost more than the steps since the last checkpoint)."""
from pathlib import Path

import pytest
import torch

from cl_platform.checkpoint import load_checkpoint

# Each pretraining step 50 ms slower (tests/experiments/conftest.py): room to kill between two checkpoints.
SLOW_PRETRAINING = {"CLP_TEST_PRETRAIN_SLEEP": "0.05"}


def saved_step(folder: Path | None) -> int:
    try:
        return load_checkpoint(folder / "last.ckpt", "pretrain")["step"]
    except Exception:  # not written yet, or being replaced right now
        return -1


@pytest.mark.slow
def test_sigkill_mid_pretraining_then_rerun_gives_the_same_base(tiny, tmp_path, kill_resume):
    pretrain = {"steps": 30, "checkpoint_every": 8, "eval_every": 10, "lr": 2e-3}  # a base of its own key
    whole = tiny.config(tmp_path / "whole.yaml", runs_root=str(tmp_path / "whole"), pretrain=pretrain)
    killed = tiny.config(tmp_path / "killed.yaml", runs_root=str(tmp_path / "killed"), pretrain=pretrain)
    reference = kill_resume.start(["pretrain", str(whole)], **SLOW_PRETRAINING)
    victim = kill_resume.start(["pretrain", str(killed)], **SLOW_PRETRAINING)
    # two checkpoints in: the kill lands between 16 and 24
    kill_resume.kill_when(lambda: saved_step(kill_resume.find(tmp_path / "killed", "pretrain-*")) >= 16, victim,
                          timeout=240, what="the second checkpoint")
    kill_resume.finish(reference)
    folder = next((tmp_path / "killed").glob("pretrain-*"))
    at = saved_step(folder)
    assert not (folder / "base.ckpt").exists() and 16 <= at < 30

    out = kill_resume.finish(kill_resume.start(["pretrain", str(killed)], **SLOW_PRETRAINING))
    assert f"pretraining: continuing from step {at} ({folder / 'last.ckpt'})" in out  # not started over
    a = load_checkpoint(next((tmp_path / "whole").glob("pretrain-*")) / "base.ckpt", "base")
    b = load_checkpoint(folder / "base.ckpt", "base")
    assert a["key"] == b["key"] and a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # fast weights included
    assert a["record"]["final_eval"] == b["record"]["final_eval"]
