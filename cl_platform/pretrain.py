"""Pretraining the base model on the mixture of every domain's `pretrain` split.

    pretrainer = Pretrainer(model=model, data=PretrainDataModule(scenario, 8, seed=0),
                            eval_loaders=scenario[0].eval_loaders(16), config=cfg.pretrain,
                            out_dir=Path("runs/pretrain-0a1b2c3d4e5f"), key=key)
    record = pretrainer.run()          # out_dir/base.ckpt, out_dir/pretrain.json, out_dir/tensorboard

The slow weights learn through the fast-weight writes, as in the paper: every forward writes the
memory chunk by chunk, the loss of chunk c+1 back-propagates into the writes of chunk c, and the
memory persists from batch to batch. AdamW (MixedAdamW) with linear warm-up and cosine decay.

Data parallel (`devices` × `num_nodes` > 1, Lightning DDP): rank r of W reads positions r, r + W,
... of the step order, batch_size / W segments a step, so the W ranks of a step read together the
batch_size segments one process would; DDP averages the slow weights' gradients and the FwPKM
layers sum their writes over the ranks (every rank holds the same memory). Every rank evaluates
(memory frozen: no collective) and keeps the record; rank 0 alone writes checkpoints, the base and
the record, and every rank resumes from the same `last.ckpt`. The loss curve is the ranks' mean.

`data` is duck-typed like `streams.datamodule.PretrainDataModule`: `set_position(epoch, start)`
and `train_dataloader()` whose sampler yields that epoch's shuffled order. The runner reads the
orders itself and feeds Lightning one DataLoader over exactly the samples still to train on, so
a resumed pretraining (`last.ckpt`, written every `checkpoint_every` steps) continues with the
same batches, learning rate and seeds as an uninterrupted one.

The record (`pretrain.json`) holds the training-loss curve, the evaluation curve on the first
`eval_segments` segments of every domain, the final loss on every full eval split, and the
unigram baseline: the cross-entropy of the eval tokens under the (add-one smoothed) unigram
distribution of the pretraining tokens — what a model that ignores context would get. It also
holds its provenance (cl_platform.provenance): the fingerprint of the code that determines the
weights (`code`), package versions, the machine and the wall seconds, summed over restarts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader

from cl_platform.atomic import WriteError, atomic_write_json
from cl_platform.callbacks import TrainingLogger, log_scalars, mark_restart
from cl_platform.checkpoint import latest_checkpoint, load_latest, previous_path, save_checkpoint
from cl_platform.config import PretrainConfig
from cl_platform.constants import IGNORE_INDEX
from cl_platform.device import HOST, Placement, launch_rank
from cl_platform.lm_module import LMModule, NonFiniteLossError, OptimSettings, mean_loss
from cl_platform.model import FwPKMLM
from cl_platform.provenance import VERSIONS, base_code, machine
from cl_platform.results import package_versions
from cl_platform.trainer import RunStopped, StepHooks, make_trainer, quiet_lightning, subset_loaders

BASE = "base.ckpt"
PROGRESS = "last.ckpt"
RECORD = "pretrain.json"


def unigram_losses(train_loader: DataLoader, eval_loaders: dict[str, DataLoader], vocab_size: int) -> dict[str, float]:
    """Per-token cross-entropy of each eval split under the add-one smoothed unigram distribution
    of the training targets (padding excluded)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64, device=HOST)
    for batch in train_loader:
        y = batch["targets"].flatten()
        counts += torch.bincount(y[y != IGNORE_INDEX], minlength=vocab_size).double()
    logp = torch.log((counts + 1) / (counts.sum() + vocab_size))
    out = {}
    for name, loader in eval_loaders.items():
        total, n = 0.0, 0
        for batch in loader:
            y = batch["targets"].flatten()
            y = y[y != IGNORE_INDEX]
            total -= float(logp[y].sum())
            n += y.numel()
        out[name] = total / n if n else math.nan
    return out


class Pretrainer:
    def __init__(
        self,
        *,
        model: FwPKMLM,
        data: Any,
        eval_loaders: dict[str, DataLoader],
        config: PretrainConfig,
        out_dir: str | os.PathLike[str],
        key: str,
        eval_batch_size: int = 16,
        progress_bar: bool = True,
        stream: dict[str, Any] | None = None,
    ):
        """`stream`: what a stream read with this base must use (tokenizer, seq_len), kept in the
        record as `stream` (experiments/base_record.py reads it back)."""
        self.config = config
        self.stream = stream
        self.data = data
        self.out_dir = Path(out_dir)
        self.key = key
        self.progress_bar = progress_bar
        self.eval_loaders = eval_loaders
        self.curve_loaders = subset_loaders(eval_loaders, config.eval_segments, eval_batch_size)
        optim = OptimSettings(lr=config.lr, weight_decay=config.weight_decay, grad_clip=config.grad_clip,
                              warmup_steps=config.warmup_steps, decay_steps=config.steps,
                              min_lr_ratio=config.min_lr_ratio)
        # The memory writes by the pretraining rule, whatever rule the model was built with.
        model.set_write_rules(config.fwpkm)
        self.module = LMModule(model, phase="pretrain", optim=optim, seed=config.seed,
                               eval_domains=list(eval_loaders), precision=config.precision)
        self.placement = Placement.of(config)
        if self.placement.world_size > 1:
            # Lightning learns the rank when the Trainer sets up; a node started by hand (NODE_RANK
            # only) would act as rank 0 until then.
            rank_zero_only.rank = launch_rank(self.placement.devices)
        self.position = self.module.position
        self.logger = TensorBoardLogger(save_dir=str(self.out_dir), name="", version="tensorboard",
                                        default_hp_metric=False)
        self.trainer: L.Trainer | None = None
        self.saved_step: int | None = None
        self.saved_path = self.out_dir / PROGRESS
        self.record: dict[str, Any] = {
            "key": key,
            "config": dataclasses.asdict(config),
            "model_config": dataclasses.asdict(model.config),
            "write_rule": dataclasses.asdict(config.fwpkm),
            "loss_curve": [],
            "eval_curve": {name: [] for name in eval_loaders},
            "seconds": 0.0,
            # The code the pretraining starts with (a resumed one keeps its first session's): a
            # cached base built by other code is found by comparing this (experiments/base.py).
            "code": base_code(),
        }
        if stream is not None:
            self.record["stream"] = stream

    @property
    def is_rank_zero(self) -> bool:
        return rank_zero_only.rank == 0

    @property
    def base_path(self) -> Path:
        return self.out_dir / BASE

    def run(self) -> dict[str, Any]:
        try:
            return self._run()
        except WriteError as err:
            last = (f"{self.saved_path} (step {self.saved_step}), intact" if self.saved_step is not None
                    else "none was written")
            raise RunStopped(f"pretraining: {err}. Last good checkpoint: {last}. Make room, then run the "
                             f"same command again to continue") from None

    def _run(self) -> dict[str, Any]:
        quiet_lightning()
        progress = self.out_dir / PROGRESS
        self._started = time.perf_counter()
        self._seconds_before = 0.0
        if latest_checkpoint(progress) is not None:
            self._restore(progress)
            self._seconds_before = self.record["seconds"]  # the sessions before, up to the checkpoint
            mark_restart(self.logger, self.position.step)
            print(f"pretraining: continuing from step {self.position.step} ({progress})", flush=True)
        else:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            train_once = DataLoader(self._dataset(), batch_size=64)
            self.record["unigram"] = unigram_losses(train_once, self.eval_loaders, self.module.model.config.vocab_size)
            self.record["unigram_mean"] = mean_loss(self.record["unigram"].values())
            log_scalars(self.logger, {f"pretrain/unigram/{d}": v for d, v in self.record["unigram"].items()}, 0)
            self.eval_point()
        remaining = self.config.steps - self.position.step
        if remaining > 0:
            hooks = StepHooks(self._after_step, on_start=self._set_trainer)
            callbacks = [TrainingLogger(self.config.log_every, "pretrain"), hooks]
            # The loader shards the steps itself (shard_data=False): a resumed run reads the rest
            # of the same sharded order.
            trainer = make_trainer(self.placement, callbacks, self.logger, self.progress_bar, shard_data=False)
            loader = self._loader(self.position.step, remaining, rank=trainer.global_rank, world=trainer.world_size)
            try:
                trainer.fit(self.module, train_dataloaders=loader)
            except NonFiniteLossError as err:
                raise RunStopped(f"pretraining: {err}. Last good checkpoint: {progress if progress.is_file() else 'none'}.") from None
            finally:
                self.trainer = None
        final = self.module.evaluate({name: loader for name, loader in self.eval_loaders.items()})
        self.record.update(
            steps=self.position.step,
            tokens=self.position.step * self.config.batch_size * self._seq_len(),
            final_eval=final,
            final_eval_mean=mean_loss(final.values()),
            seconds=self._seconds(),
            versions=package_versions(VERSIONS),  # of the session that finished the base
            machine=machine(),
        )
        log_scalars(self.logger, {f"pretrain/final/{d}": v for d, v in final.items()}, self.position.step)
        if not self.is_rank_zero:
            return self.record
        save_checkpoint(self.base_path, "base", self.module.model.config, {
            "key": self.key, "model": self.module.model.state_dict(), "record": self.record,
        })
        atomic_write_json(self.out_dir / RECORD, self.record)
        progress.unlink(missing_ok=True)
        previous_path(progress).unlink(missing_ok=True)
        self.logger.finalize("success")
        return self.record

    def _seconds(self) -> float:
        """Wall seconds of pretraining so far, this session's and the checkpointed ones before it."""
        return self._seconds_before + time.perf_counter() - self._started

    def _set_trainer(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def _after_step(self, step: int) -> None:
        """Every step: the loss curve; every `eval_every` steps: evaluation; checkpoints when due."""
        cfg = self.config
        self.record["loss_curve"].append([step, self._rank_mean(self.module.last_losses["lm"])])
        if step % cfg.eval_every == 0 or step == cfg.steps:
            self.eval_point()
        if step % cfg.checkpoint_every == 0 and step < cfg.steps:
            self.save_progress()

    def eval_point(self) -> None:
        values = self.module.evaluate(self.curve_loaders)
        step = self.position.step
        for name, value in values.items():
            self.record["eval_curve"][name].append([step, value])
        metrics = {f"pretrain/eval/{d}/loss": v for d, v in values.items()}
        metrics["pretrain/eval/mean_loss"] = mean_loss(values.values())
        log_scalars(self.logger, metrics, step)

    def _rank_mean(self, value: float) -> float:
        """`value` averaged over the data-parallel ranks (itself in one process)."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return value
        # On the ranks' own device (NCCL reduces CUDA tensors only); every rank calls this each step.
        mean = trainer.strategy.reduce(torch.tensor(value, dtype=torch.float64, device=trainer.strategy.root_device),
                                       reduce_op="mean")
        return float(mean)

    def save_progress(self) -> None:
        if not self.is_rank_zero:
            return  # every rank holds the same weights, memory and optimiser state
        trainer = self.trainer
        optimizer = trainer.optimizers[0].state_dict() if trainer is not None and trainer.optimizers else None
        # The seconds so far go into the checkpoint, so a resumed run's record sums its sessions
        # (the time between a kill and its checkpoint is lost: at most checkpoint_every steps).
        self.record["seconds"] = self._seconds()
        save_checkpoint(self.out_dir / PROGRESS, "pretrain", self.module.model.config, {
            "key": self.key, "model": self.module.model.state_dict(), "optimizer": optimizer,
            "step": self.position.step, "record": self.record,
        }, keep_previous=True)
        self.saved_step, self.saved_path = self.position.step, self.out_dir / PROGRESS

    def _restore(self, path: Path) -> None:
        data, used = load_latest(path, "pretrain", self.module.model.config)
        self.saved_step, self.saved_path = data.get("step"), used
        if data.get("key") != self.key:
            raise RunStopped(f"{path} belongs to another pretraining ({data.get('key')}, expected {self.key})")
        self.module.model.load_state_dict(data["model"])
        self.module.load_optimizer_state(data["optimizer"])
        self.position.step = data["step"]
        self.record = data["record"]
        if self.stream is not None:  # a pretraining started before records had it
            self.record["stream"] = self.stream

    # --- data ---------------------------------------------------------------------------------
    def _dataset(self):
        self.data.set_position(0, 0)
        return self.data.train_dataloader().dataset

    def _seq_len(self) -> int:
        return int(self._dataset()[0]["input_ids"].shape[0])

    def _loader(self, done_steps: int, steps: int, rank: int = 0, world: int = 1) -> DataLoader:
        """The samples of steps done_steps .. done_steps + steps, epoch orders from `data`; with
        `world` ranks, rank `rank`'s share: positions rank, rank + world, ... of that order, in
        batches of batch_size / world (so step k of every rank reads from the same global batch)."""
        batch = self.config.batch_size
        dataset = self._dataset()
        n = len(dataset)
        first, last = done_steps * batch, (done_steps + steps) * batch
        indices: list[int] = []
        for epoch in range(first // n, (last - 1) // n + 1):
            self.data.set_position(epoch, 0)
            order = list(self.data.train_dataloader().sampler)
            lo, hi = max(first - epoch * n, 0), min(last - epoch * n, n)
            indices += order[lo:hi]
        return DataLoader(dataset, batch_size=batch // world, sampler=indices[rank::world])
