"""A 2-rank `finetune` run (Lightning DDP, gloo, CPU processes) killed with SIGKILL mid-experience
or during an evaluation, continued with --resume, gives the same results as an uninterrupted
2-rank run, bit for bit.

The experience holds an odd number of segments (13), so the last global batch needs padding:
a resume that sharded only the rest of the experience would pad it with another segment than
the uninterrupted run (torch's DistributedSampler pads with the first indices of what it is
given), which is what `streams.datamodule.ResumableSampler` prevents."""
import json

import numpy as np
import pytest

from cl_platform.results import RunResults


@pytest.mark.slow
def test_ddp_finetune_killed_mid_experience_and_during_evaluation_resumes_to_the_same_results(
        tiny, tmp_path, kill_resume):
    from experiments.base import resolve_base
    from experiments.setup import load_setup

    stream = tiny.write_yaml(tmp_path / "odd.yaml", {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache"),
                                                     "token_budget": {**tiny.stream_spec["token_budget"], "adapt": 416}})
    overrides = dict(stream=str(stream), model={"dropout": 0.1}, strategy={"name": "slow"},
                     cl={"mode": "finetune", "devices": 2, "curve_every": 1, "checkpoint_every": 2})
    # One base for all three runs, built here so that they do not race to pretrain it.
    resolve_base(load_setup(tiny.config(tmp_path / "base.yaml", **overrides)), progress_bar=False, say=lambda _: None)
    marks = tmp_path / "marks"
    marks.mkdir()

    # The slow strategy sleeps 0.2 s a step (tests/experiments/conftest.py): room to kill mid-experience.
    reference = kill_resume.start(["run", str(tiny.config(tmp_path / "whole.yaml", name="ddp-whole", **overrides))])
    mid = kill_resume.start(["run", str(tiny.config(tmp_path / "mid.yaml", name="ddp-mid", **overrides))])
    # 13 segments, 2 per rank and step: steps 1-4 are experience 1, the checkpoint of step 2 is the
    # last one before the kill at step 3, so the resume streams 5 segments (padding needed).
    kill_resume.kill_when(lambda: kill_resume.curve_step(tiny.runs, "ddp-mid-*") >= 3, mid)
    # The evaluation of row 1 leaves a mark and sleeps 3 s: room to kill during it.
    in_eval = kill_resume.start(["run", str(tiny.config(tmp_path / "eval.yaml", name="ddp-eval", **overrides))],
                                CLP_TEST_SLOW_ROW="1", CLP_TEST_MARKS=str(marks))
    kill_resume.kill_when((marks / "evaluating-1-rank0").exists, in_eval)
    whole_out = kill_resume.finish(reference)

    folders = {name: next(tiny.runs.glob(f"ddp-{name}-*")) for name in ("whole", "mid", "eval")}
    for name in ("mid", "eval"):
        partial = RunResults.from_json(folders[name] / "results.json")
        assert not partial.matrix.is_complete
        resumed_out = kill_resume.finish(kill_resume.start(["run", str(tmp_path / f"{name}.yaml"), "--resume"]))
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
