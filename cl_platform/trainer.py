"""Trainer plumbing shared by pretraining and the continual-learning runner.

    trainer = make_trainer(Placement(), callbacks=[StepHooks(on_step)], logger=logger, progress_bar=True)
    trainer.fit(module, train_dataloaders=loader)

Both runners use a fresh Trainer for every fit and every evaluation (a Trainer that has reached
`max_steps` trains nothing more), count progress in their own run step (`LMModule.position.step`),
and hear about every finished batch through `StepHooks`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable

import lightning as L
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, Subset

from cl_platform.callbacks import ExperienceProgressBar, ProgressLines
from cl_platform.device import Placement


class RunStopped(RuntimeError):
    """The run stopped on a non-finite loss; the message names the step and the last good checkpoint."""


def quiet_lightning() -> None:
    """Silence Lightning's advice that does not apply here (CPU only, in-memory segments, and
    fast mode deliberately has no optimiser)."""
    for pattern in (
        ".*does not have many workers.*",
        ".*returned `None`, this fit will run with no optimizer.*",
        ".*GPU available but not used.*",
        ".*The number of training batches.*is smaller than the logging interval.*",
        ".*Consider setting `persistent_workers=True`.*",
        ".*You defined a `validation_step` but have no `val_dataloader`.*",
        ".*Total length of `.*` across ranks is zero.*",
        ".*module\\(s\\) in eval mode at the start of training.*",  # fast mode adapts in eval mode on purpose
        ".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
    ):
        warnings.filterwarnings("ignore", pattern)
    import logging

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.distributed", "lightning.pytorch.strategies.ddp"):
        logging.getLogger(name).setLevel(logging.WARNING)


def make_trainer(placement: Placement, callbacks: list, logger: Any, progress_bar: bool,
                 shard_data: bool = True) -> L.Trainer:
    """A fresh Trainer for one fit or one evaluation, placed as `placement` says (accelerator,
    devices, num_nodes: cl_platform/device.py). A world of more than one process: DDP, gloo on
    CPU and NCCL on CUDA; buffers are not broadcast (the FwPKM layers sum their writes over ranks
    themselves, so every rank holds the same memory; broadcasting rank 0's would hide a divergence).
    `shard_data=False` lets every rank read all of its data (evaluations: every rank computes the
    whole results row, no reduction needed). `progress_bar`: training progress, as Lightning's bar
    when stdout is a terminal and as periodic plain lines (`ProgressLines`) when it is a file."""
    strategy: Any = "auto"
    if placement.world_size > 1:
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend=placement.ddp_backend(), broadcast_buffers=False)
    # A bar on a terminal; in a log file (stdout redirected) its carriage returns would make one
    # endless line, so plain lines instead.
    bar = progress_bar and sys.stdout.isatty()
    if bar:
        callbacks = [*callbacks, ExperienceProgressBar()]
    elif progress_bar:
        callbacks = [*callbacks, ProgressLines()]
    return L.Trainer(
        accelerator=placement.accelerator,
        devices=placement.devices,
        num_nodes=placement.num_nodes,
        strategy=strategy,
        max_epochs=1,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(c, Checkpoint) for c in callbacks),
        enable_progress_bar=bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        inference_mode=False,  # the `stream` memory policy writes in place during evaluation
        use_distributed_sampler=shard_data,
        log_every_n_steps=1,
    )


def subset_loaders(loaders: dict[str, DataLoader], segments: int, batch_size: int) -> dict[str, DataLoader]:
    """The first `segments` segments of each loader's dataset, in order."""
    return {
        name: DataLoader(Subset(loader.dataset, range(min(segments, len(loader.dataset)))), batch_size=batch_size)
        for name, loader in loaders.items()
    }



class StepHooks(Checkpoint):
    """Calls `on_step(step)` after every training batch with the run's step. A `Checkpoint`
    subclass, so Lightning runs it after every other callback: loggers see the batch first, and a
    checkpoint written here holds everything the batch produced."""

    def __init__(self, on_step: Callable[[int], None], on_start: Callable[[L.Trainer], None] | None = None,
                 on_sigterm: Callable[[], None] | None = None):
        self.on_step = on_step
        self.on_start = on_start
        self.on_sigterm = on_sigterm

    def on_train_start(self, trainer, pl_module) -> None:
        if self.on_start is not None:
            self.on_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.on_step(pl_module.position.step)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Lightning's training loops raise SIGTERMException only between batches (after a batch's
        # hooks, at the end of the epoch, or before the next batch under DDP), so the model and
        # the optimiser, still the Trainer's here, are at a step boundary: `on_sigterm` may save.
        # A signal that lands after `on_step` has run is heard only here.
        if isinstance(exception, SIGTERMException) and self.on_sigterm is not None:
            self.on_sigterm()
