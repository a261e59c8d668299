"""A run stopped by SIGTERM (a scheduler's preemption) writes its checkpoint at the step in
progress, exits 143 with one line naming it, and `--resume` gives what an uninterrupted run gives,
bit for bit.

The periodic checkpoint is set beyond the run's length, so the only checkpoint at a step after
row 0 is the one SIGTERM writes: a handler that did not save (or saved the wrong step) fails the
step assertions, and one that lost or repeated work fails the equality with the whole run. The
signal comes once from outside at a random moment of step 3 or later, and once from inside right
after the step hooks of step 3 have run (the moment a handler that only looks in the hook misses)."""
import re
import signal

import numpy as np
import pytest
import torch

from cl_platform.preemption import EXIT_CODE
from cl_platform.results import RunResults


@pytest.mark.slow
@pytest.mark.parametrize("when", ["from outside", "after the step hooks"])
def test_sigterm_saves_the_step_in_progress_and_resume_equals_the_whole_run(tiny, tmp_path, kill_resume, when):
    from experiments.base import resolve_base
    from experiments.setup import load_setup

    tag = "out" if when == "from outside" else "hook"  # the runs folder is the session's: names of their own
    overrides = dict(strategy={"name": "slow"}, cl={"curve_every": 1, "checkpoint_every": 1000})
    resolve_base(load_setup(tiny.config(tmp_path / "base.yaml", **overrides)), progress_bar=False, say=lambda _: None)
    # The slow strategy (tests/experiments/conftest.py): 0.2 s a step.
    whole = kill_resume.start(["run", str(tiny.config(tmp_path / "whole.yaml", name=f"term-whole-{tag}", **overrides))])
    cut = ["run", str(tiny.config(tmp_path / "term.yaml", name=f"term-cut-{tag}", **overrides))]
    if when == "from outside":
        preempted = kill_resume.start(cut)
        [(out, err)] = kill_resume.kill_when(lambda: kill_resume.curve_step(tiny.runs, f"term-cut-{tag}-*") >= 3, preempted,
                                             sig=signal.SIGTERM, what="step 3")
    else:
        preempted = kill_resume.start(cut, CLP_TEST_SIGTERM_AT_STEP="3")
        out, err = preempted.communicate(timeout=600)
    assert preempted.returncode == EXIT_CODE == 143, (out[-2000:], err[-3000:])
    line = err.strip().splitlines()[-1]
    assert line.startswith("clp run: stopped by SIGTERM; last checkpoint:") and "--resume" in line, err[-3000:]
    folder = next(tiny.runs.glob(f"term-cut-{tag}-*"))
    saved_step = int(re.search(r"\(step (\d+)\)", line).group(1))
    checkpoint = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    # The checkpoint is the one SIGTERM wrote: at the step the run stopped, past every curve point
    # it had recorded when the signal came, and not row 0's (step 0, the only periodic one).
    assert checkpoint["position"]["step"] == saved_step >= 3
    if when == "after the step hooks":
        assert saved_step == 3
    assert kill_resume.last_curve_step(folder) == saved_step
    assert not RunResults.from_json(folder / "results.json").matrix.is_complete

    kill_resume.finish(whole)
    out = kill_resume.finish(kill_resume.start(["run", str(tmp_path / "term.yaml"), "--resume"]))
    assert f"(step {saved_step})" in out
    a = RunResults.from_json(next(tiny.runs.glob(f"term-whole-{tag}-*")) / "results.json")
    b = RunResults.from_json(folder / "results.json")
    assert b.matrix.is_complete
    assert np.array_equal(a.matrix.values, b.matrix.values)
    assert a.curves == b.curves and a.doc_losses == b.doc_losses and a.row_steps == b.row_steps
