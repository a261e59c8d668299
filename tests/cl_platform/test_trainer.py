"""Trainer plumbing: training progress reads well where it goes. On a terminal, Lightning's bar; in a
log file (stdout not a terminal), periodic plain lines and no carriage return, which would make
the whole training one endless line of the file."""
import io
import re
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from cl_platform.callbacks import ExperienceProgressBar, ProgressLines
from cl_platform.device import Placement
from cl_platform.lm_module import LMModule
from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.trainer import make_trainer, quiet_lightning

V, T = 64, 20


def module() -> LMModule:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, fwpkm_layers=[0], window=8,
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16))
    m = LMModule(FwPKMLM(cfg, WriteRule(chunk=8)), phase="fast")
    m.progress_label = "exp 1/2 math"
    return m


def loader(n: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(2, V, (T + 1,), generator=g) for _ in range(n)]
    return DataLoader([{"input_ids": s[:-1], "targets": s[1:]} for s in seqs], batch_size=1)


@pytest.fixture(autouse=True)
def _quiet():
    quiet_lightning()


LINE = re.compile(r"^exp 1/2 math: (\d+)/20 batches \(\d+%\), step (\d+), loss \d+\.\d{3}, \d+ s$")


def test_in_a_log_file_training_progress_is_plain_lines_without_carriage_returns(capsys):
    assert not sys.stdout.isatty()  # pytest's capture: what `clp run > log 2>&1` gives the process
    trainer = make_trainer(Placement(), [], logger=False, progress_bar=True)
    assert not any(isinstance(c, ExperienceProgressBar) for c in trainer.callbacks)
    trainer.fit(module(), train_dataloaders=loader(20))
    out = capsys.readouterr()
    assert "\r" not in out.out and "\r" not in out.err
    lines = [line for line in out.out.splitlines() if line.startswith("exp 1/2 math")]
    matches = [LINE.match(line) for line in lines]
    assert all(matches), lines
    done = [int(m.group(1)) for m in matches]
    # A line at every tenth of the fit (more only if 30 s passed between two), the last at its end.
    assert set(range(2, 21, 2)) <= set(done) and done == sorted(done) and done[-1] == 20
    assert [int(m.group(2)) for m in matches] == done  # the run step: one per batch from 0


def test_on_a_terminal_the_bar_is_kept(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    trainer = make_trainer(Placement(), [], logger=False, progress_bar=True)
    assert any(isinstance(c, ExperienceProgressBar) for c in trainer.callbacks)
    assert not any(isinstance(c, ProgressLines) for c in trainer.callbacks)
    trainer.fit(module(), train_dataloaders=loader(4))
    assert "\r" in terminal.getvalue() and "exp 1/2 math" in terminal.getvalue()  # the bar redraws in place


def test_no_progress_asked_for_prints_none(capsys):
    trainer = make_trainer(Placement(), [], logger=False, progress_bar=False)
    trainer.fit(module(), train_dataloaders=loader(4))
    assert "batches" not in capsys.readouterr().out


def test_a_sigterm_after_the_step_hook_has_looked_still_reaches_on_sigterm_at_that_step():
    """The race a scheduler's SIGTERM can win: it lands after `on_step` has run for a batch, and
    Lightning stops the fit at that batch's end. `on_sigterm` must hear of it, at that very step,
    with no further batch trained."""
    import os
    import signal

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from cl_platform.trainer import StepHooks

    seen, stops = [], []
    m = module()

    def on_step(step: int) -> None:
        seen.append(step)
        if step == 3:  # the hook has looked; the signal comes now
            os.kill(os.getpid(), signal.SIGTERM)

    hooks = StepHooks(on_step, on_sigterm=lambda: stops.append(m.position.step))
    trainer = make_trainer(Placement(), [hooks], logger=False, progress_bar=False)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: None)  # Lightning keeps this one beside its own: the test survives
    try:
        with pytest.raises(SIGTERMException):
            trainer.fit(m, train_dataloaders=loader(10))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [1, 2, 3] and stops == [3] and m.position.step == 3
