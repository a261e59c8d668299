"""The continual-learning runner: a model, a stream of domains, a strategy → a results matrix.

    runner = ContinualRunner(model=model, stream=scenario, strategy=NaiveStrategy(), config=cfg,
                             run_dir=Path("runs/default-1a2b3c4d5e6f"), config_hash=h)
    results = runner.run(resume_from=None)       # RunResults, also in run_dir/results.json

Protocol (docs/protocol.md):
    row 0      every domain's eval split, before any experience
    for each experience t = 1..T (domain d_t):
        strategy.on_experience_start; one pass over d_t's adapt data (a fresh Lightning Trainer:
        `fast` streams it with writes on and slow weights frozen, `finetune` also trains the slow
        weights); every `cl.curve_every` steps every domain is evaluated on a few eval segments
        (forgetting curves, TensorBoard `eval/<domain>/loss` against the step);
        strategy.on_experience_end; row t: every domain's full eval split.
Every evaluation runs under the configured memory policy (cl_platform.memory_policy); with the
default, `frozen`, evaluation never changes the model.

The stream is duck-typed (this package imports no data code): `len(stream)`, `stream[i]` is
experience i+1 with `.domain`, `.adapt_loader(batch_size, start=...)` (in-order DataLoader that
skips `start` segments) and `.eval_loaders(batch_size)` ({domain: DataLoader}, in
`stream.eval_domains` order). `streams.build_stream` returns such an object.

Resume: a checkpoint (`run_dir/checkpoints/last.ckpt`, written atomically, the one before it kept
as `prev.ckpt` for a newest one that cannot be read: cl_platform.checkpoint) holds the model with
its fast weights, the optimiser state, the strategy state, the data position (experience, segments
done, whether the experience has started), the run step and the results and curves so far. It is
written every `cl.checkpoint_every` steps and after every row; once the last row is measured, the
run keeps what `cl.keep_checkpoints` says (by default the final checkpoint alone). A run killed
at any moment continues from it (`run(resume_from=...)`) and produces the same matrix as an uninterrupted run
(SIGTERM, a scheduler's preemption, first writes one at the step in progress: cl_platform/preemption.py):
randomness is reseeded from (seed, step) at every batch, so nothing depends on when the process
started. The checkpoint also holds the wall seconds spent in each phase (row 0, each experience's
training and its row), so the timings in run.json add up over restarts.

Faults: a file that cannot be written (a full disk: checkpoint, results, records) stops the run
with `RunStopped`, one line naming the file and the last good checkpoint, which the failed write
left intact; `--resume` once there is room continues from it exactly. The run folder itself
(whether to start, resume or refuse it, its run.json, its lock) is cl_platform.run_dir's: the
caller (experiments/run.py) settles it before the runner starts; the runner writes its checkpoint,
results and timings into it.

Data parallelism (`cl.devices` × `cl.num_nodes` > 1, finetune mode): Lightning DDP (gloo on CPU,
NCCL on CUDA: cl_platform/device.py), each rank training on its shard of the experience. The
paper's code lets every rank write its
own shard into its own memory, so the ranks' fast weights drift apart and which model is being
evaluated depends on the rank. Here every FwPKM write is summed over the ranks
(`cl_platform.memory.fwpkm.RankSum`): each rank applies the write one process would make from the
whole global batch, so all ranks hold the same memory. DDP must then not broadcast buffers
(`broadcast_buffers=False`): rank 0's memory would overwrite the others' every step and hide any
divergence. After every experience the runner checks that the ranks' memories are identical;
evaluations run the full eval splits on every rank (no reduction), and rank 0 writes the files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from cl_platform.atomic import WriteError, atomic_write_json
from cl_platform.callbacks import RunCallback, TrainingLogger, log_scalars, mark_restart
from cl_platform.checkpoint import keep_after_run, load_latest, save_checkpoint
from cl_platform.config import RunConfig
from cl_platform.device import HOST, Placement, launch_rank
from cl_platform.lm_module import LMModule, NonFiniteLossError, OptimSettings, RunPosition, step_seed
from cl_platform.memory_policy import get_memory_policy
from cl_platform.model import FwPKMLM
from cl_platform.preemption import RunPreempted, SigtermWatch
from cl_platform.provenance import PhaseClock
from cl_platform.results import ResultsMatrix, RunResults, package_versions, perplexity
from cl_platform.run_dir import CHECKPOINT, RunDirError, update_run_json
from cl_platform.strategy import Strategy, StrategyContext
from cl_platform.trainer import RunStopped, StepHooks, make_trainer, quiet_lightning, subset_loaders


def digest(tensors: Iterable[torch.Tensor]) -> bytes:
    """sha256 of the tensors' shapes and bytes, in order (equal digests: bit-equal tensors)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.detach().to(HOST).contiguous().view(torch.uint8).numpy().tobytes())
    return h.digest()


class ContinualRunner:
    """One run of the protocol above; files go to `run_dir` (results.json, checkpoints/,
    tensorboard/). `callbacks`: Lightning callbacks added to every Trainer; those that are
    `RunCallback`s also hear about results rows and the end of the run."""

    def __init__(
        self,
        *,
        model: FwPKMLM,
        stream: Any,
        strategy: Strategy,
        config: RunConfig,
        run_dir: str | os.PathLike[str],
        config_hash: str,
        callbacks: list[L.Callback] | None = None,
        progress_bar: bool = True,
        say: Callable[[str], None] = print,
    ):
        self.config = config
        self.say = say
        self.stream = stream
        self.strategy = strategy
        self.run_dir = Path(run_dir)
        self.ckpt_path = self.run_dir / CHECKPOINT
        self.results_path = self.run_dir / "results.json"
        self.progress_bar = progress_bar
        cl = config.cl
        optim = None
        if cl.mode == "finetune":
            optim = OptimSettings(lr=cl.lr, weight_decay=cl.weight_decay, grad_clip=cl.grad_clip)
        self.domains = list(stream.eval_domains)
        self.experiences = [stream[i].domain for i in range(len(stream))]
        # The continual phase's write rule replaces the one the base was pretrained with.
        model.set_write_rules(cl.fwpkm, cl.fwpkm_by_layer)
        self.position = RunPosition()
        self.module = LMModule(model, phase=cl.mode, optim=optim, strategy=strategy,
                               memory_policy=get_memory_policy(cl.eval_memory), seed=config.seed,
                               eval_domains=self.domains, position=self.position, precision=cl.precision)
        self.results = RunResults(
            matrix=ResultsMatrix.empty(self.domains, self.experiences),
            config_hash=config_hash,
            seed=config.seed,
            mode=cl.mode,
            memory_policy=cl.eval_memory,
            strategy=config.strategy_name,
            versions=package_versions(),
            memory_reset=ResultsMatrix.empty(self.domains, self.experiences),
        )
        # The base's fast memory and slow weights (the model is the base's until a checkpoint is
        # restored in run()): each row is read a second time with this memory put back.
        self.base_memory = model.snapshot_memory()
        self._base_slow = digest(model.parameters())  # a hash, not a copy: the paper preset is 0.5 GB
        self.saved_step: int | None = None
        # (model state, strategy state) of a checkpoint resumed in the middle of an experience,
        # until that experience's start hook has run again (_start_again).
        self._mid_experience: tuple[dict, dict] | None = None
        self.sigterm = SigtermWatch()  # installed while run() runs (cl_platform/preemption.py)
        placement = Placement.of(config.cl)
        if placement.world_size > 1:
            # Lightning sets the rank when the first Trainer sets up; a node started by hand
            # (NODE_RANK only) would act as rank 0 until then (a resume's messages, its logger).
            rank_zero_only.rank = launch_rank(placement.devices)
        self.saved_path = self.ckpt_path
        # Wall seconds per phase ("row0_eval", "exp<t>_train", "exp<t>_eval"), in the checkpoint
        # so that they add up over restarts; written to run.json after every row.
        self.clock = PhaseClock()
        self.trainer: L.Trainer | None = None
        self.logger = TensorBoardLogger(save_dir=str(self.run_dir), name="", version="tensorboard", default_hp_metric=False)
        eval_loaders = stream[0].eval_loaders(cl.eval_batch_size, split=cl.eval_split)
        self.eval_loaders = [eval_loaders[d] for d in self.domains]
        self.curve_loaders = subset_loaders(eval_loaders, cl.curve_segments, cl.eval_batch_size)
        self.callbacks = list(callbacks or [])
        hooks = StepHooks(self._after_step, on_start=self._set_trainer, on_sigterm=self._save_on_sigterm)
        self._lightning_callbacks = [TrainingLogger(cl.log_every, "train"), *self.callbacks, hooks]

    @property
    def is_rank_zero(self) -> bool:
        # Read when needed: under DDP the rank is only known once the first Trainer has set up.
        return rank_zero_only.rank == 0

    # --- the protocol ---------------------------------------------------------------------------
    def run(self, resume_from: str | os.PathLike[str] | None = None,
            on_restored: Callable[[], None] | None = None) -> RunResults:
        """The whole stream, or what is left of it after `resume_from`; `on_restored` is called
        once that checkpoint has loaded (the caller records the resume then, not before)."""
        quiet_lightning()
        if resume_from is not None:
            self._restore(resume_from)
            mark_restart(self.logger, self.position.step)
        if on_restored is not None:
            on_restored()
        try:
            with self.sigterm:
                self._run()
        except SIGTERMException:  # Lightning's loops stop after the batch in progress
            raise self._preempted() from None
        except WriteError as err:
            last = (f"{self.saved_path} (step {self.saved_step}), intact" if self.saved_step is not None
                    else "none was written")
            raise RunStopped(f"{err}. The run stopped; last good checkpoint: {last}. Make room, then "
                             f"continue with --resume") from None
        return self.results

    def _run(self) -> None:
        matrix = self.results.matrix
        if matrix.last_complete_row < 0:
            self.clock.start("row0_eval")
            self._evaluate_row(0)
            self.curve_point()
            self.save()
            self._write_timings()
            self._stop_if_preempted()
        for t in range(matrix.last_complete_row + 1, matrix.num_experiences + 1):
            self.clock.start(f"exp{t}_train")
            exp = self.stream[t - 1]
            ctx = self._context(t, exp)
            self._train(ctx, exp)
            torch.manual_seed(step_seed(self.config.seed, self.position.step) ^ 0x2)
            self.strategy.on_experience_end(ctx)
            if self.is_rank_zero:
                atomic_write_json(self.run_dir / "strategy.json",
                                  {"name": self.results.strategy, "after_experience": t, **self.strategy.summary()})
            if self._last_curve_step() != self.position.step:
                self.curve_point()
            self.clock.start(f"exp{t}_eval")
            self._evaluate_row(t)
            self.position.end_experience()
            self.save()
            self._write_timings()
            self._stop_if_preempted()
        self.clock.stop()
        self._write_timings()
        for cb in self._run_callbacks():
            cb.on_run_end(self)
        self.logger.finalize("success")
        if self.is_rank_zero:
            # Every row is in results.json, so the folder reads as complete whatever goes now: a
            # finished run keeps only what cl.keep_checkpoints asks for (by default the final one).
            keep_after_run(self.ckpt_path, self.config.cl.keep_checkpoints)

    def _set_trainer(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def _after_step(self, step: int) -> None:
        """After every training batch: forgetting-curve point and checkpoint when due."""
        cl = self.config.cl
        if step % cl.curve_every == 0:
            self.curve_point()
        if step % cl.checkpoint_every == 0:
            self.save()

    def _save_on_sigterm(self) -> None:
        """Lightning stops the fit between two batches on SIGTERM: the checkpoint of the step just
        done (unless it is already the last one written), so the resume starts at this step."""
        if self.saved_step != self.position.step:
            self.save()

    def _preempted(self) -> RunPreempted:
        last = f"{self.saved_path} (step {self.saved_step})" if self.saved_step is not None else "none was written"
        return RunPreempted(f"stopped by SIGTERM; last checkpoint: {last}. Continue with --resume")

    def _stop_if_preempted(self) -> None:
        """Between Lightning's fits only this module's handler hears SIGTERM: stop at a checkpoint."""
        if self.sigterm.received:
            raise self._preempted()

    def _run_callbacks(self) -> list[RunCallback]:
        # Reports (printed lines, images, hparams) come from one process; every rank has the same results.
        return [cb for cb in self.callbacks if isinstance(cb, RunCallback)] if self.is_rank_zero else []

    def _last_curve_step(self) -> int | None:
        points = self.results.curves.get(self.domains[0])
        return points[-1][0] if points else None

    def _context(self, t: int, exp: Any) -> StrategyContext:
        ctx = StrategyContext(
            model=self.module.model,
            experience=t,
            domain=exp.domain,
            global_step=self.position.step,
            mode=self.config.cl.mode,
            current=exp,
            stream=self.stream,
            num_experiences=len(self.experiences),
            eval_domains=tuple(self.domains),
        )
        self.module.begin_experience(ctx, label=f"exp {t}/{len(self.experiences)} {exp.domain}")
        return ctx

    def _train(self, ctx: StrategyContext, exp: Any) -> None:
        if not self.position.started:
            # Addressing-health statistics are per experience; the strategy hears about the end
            # of the previous experience before they are cleared.
            for layer in self.module.model.fwpkm_layers():
                layer.reset_read_counts()
            self._start_hook(ctx)
            self.position.start_experience()
        elif self._mid_experience is not None:
            self._start_again(ctx)
        # The loader shards the experience itself (shard_data=False): a resumed DDP run then reads
        # the rest of the same sharded order (streams/datamodule.py:ResumableSampler).
        trainer = make_trainer(Placement.of(self.config.cl), self._lightning_callbacks, self.logger, self.progress_bar,
                               shard_data=False)
        loader = exp.adapt_loader(self.config.cl.batch_size, start=self.position.segments_done,
                                  rank=trainer.global_rank, world=trainer.world_size)
        if len(loader) == 0:  # killed after the last batch's checkpoint: nothing left to stream
            return
        try:
            trainer.fit(self.module, train_dataloaders=loader)
        except NonFiniteLossError as err:
            last = f"{self.ckpt_path} (step {self.saved_step})" if self.saved_step is not None else "none was written"
            raise RunStopped(f"{err}. The run stopped; last good checkpoint: {last}.") from None
        finally:
            self.trainer = None
        self._check_ranks_agree(ctx.experience)

    def _start_again(self, ctx: StrategyContext) -> None:
        """Resumed in the middle of an experience: its start hook runs again (`ctx.resumed`), then
        the checkpoint's model and strategy state are put back over whatever the hook changed. So
        what a start hook sets that no checkpoint holds (write rules, writes on or off, attributes
        it derives from the context) is set as in the uninterrupted run, and what the checkpoint
        holds (weights, fast memory, slot masks, the strategy's state_dict) is exactly as saved:
        the natural strategy, which sets things up in on_experience_start, resumes exactly."""
        model_state, strategy_state = self._mid_experience
        self._mid_experience = None
        self._start_hook(dataclasses.replace(ctx, resumed=True))
        self.module.model.load_state_dict(model_state)
        self.strategy.load_state_dict(strategy_state)

    def _start_hook(self, ctx: StrategyContext) -> None:
        # Seeded from (seed, step), so the hook draws the same numbers whenever it runs.
        torch.manual_seed(step_seed(self.config.seed, self.position.step) ^ 0x1)
        self.strategy.on_experience_start(ctx)

    def _check_ranks_agree(self, t: int) -> None:
        """Under DDP every rank must hold the same fast weights (the FwPKM layers sum their writes
        over ranks); a difference would make the ranks' results rows disagree silently."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        layers = self.module.model.fwpkm_layers()
        mine_digest = digest(x for layer in layers for x in (layer.keys, layer.values))
        # NCCL gathers CUDA tensors only; gloo, host ones.
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else HOST
        mine = torch.tensor(list(mine_digest), dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        if not all(torch.equal(every[0], d) for d in every):
            raise RuntimeError(f"after experience {t} the ranks hold different fast-weight memories")

    def _evaluate_row(self, t: int) -> None:
        trainer = make_trainer(Placement.of(self.config.cl), self._lightning_callbacks, self.logger, self.progress_bar,
                               shard_data=False)
        trainer.validate(self.module, dataloaders=self.eval_loaders, verbose=False)
        for domain in self.domains:
            self.results.matrix.record(t, domain, self.module.last_eval[domain])
        self.results.doc_losses[str(t)] = self.module.last_eval_docs
        self.results.row_steps[str(t)] = self.position.step
        reset = self._row_without_memory(t) if self.results.memory_reset is not None else {}
        for domain, value in reset.items():  # none for a run resumed from a checkpoint from before it
            self.results.memory_reset.record(t, domain, value)
        row = {f"results/{d}/loss": v for d, v in self.module.last_eval.items()}
        row |= {f"results_memory_reset/{d}/loss": v for d, v in reset.items()}
        log_scalars(self.logger, row, self.position.step)
        self._write_results()
        for cb in self._run_callbacks():
            cb.on_results_row(self, t)

    def _row_without_memory(self, t: int) -> dict[str, float]:
        """Row t read with the fast memory put back to the base's (and no strategy routing): what
        the slow weights hold of the stream. While the slow weights are still the base's and no
        layer reads a slow memory beside its fast one (`FwPKM.extra_read`: slot transfer's banks),
        the model is then the base itself and the row is row 0's, not read again (fast mode's
        strategies that touch only the memory: their consolidated fraction is 0 exactly)."""
        model = self.module.model
        if t == 0 or (all(layer.extra_read is None for layer in model.fwpkm_layers())
                      and digest(model.parameters()) == self._base_slow):
            return {d: float(self.results.matrix.values[0, j]) for j, d in enumerate(self.results.matrix.domains)}
        # The row's own validation, on a Trainer of its own (no user callbacks: a pruner or a
        # recorder hears the row once), with every domain reading the base's memory.
        module, current = self.module, model.snapshot_memory()
        kept = module.last_eval, module.last_eval_docs
        model.restore_memory(self.base_memory)
        module.route_eval = False
        try:
            trainer = make_trainer(Placement.of(self.config.cl), [], False, False, shard_data=False)
            trainer.validate(module, dataloaders=self.eval_loaders, verbose=False)
            return dict(module.last_eval)
        finally:
            model.restore_memory(current)
            module.route_eval = True
            module.last_eval, module.last_eval_docs = kept

    def curve_point(self) -> None:
        """Evaluate every domain on its curve segments and append the point at the current step."""
        values = self.module.evaluate(self.curve_loaders)
        step = self.position.step
        metrics = {}
        for domain, value in values.items():
            self.results.add_point(domain, step, value)
            metrics[f"eval/{domain}/loss"] = value
            metrics[f"eval/{domain}/ppl"] = perplexity(value)
        log_scalars(self.logger, metrics, step)
        self._write_results()
        for cb in self._run_callbacks():
            cb.on_curve_point(self, step)

    # --- files ------------------------------------------------------------------------------------
    def _write_results(self) -> None:
        if self.is_rank_zero:
            self.results.to_json(self.results_path)

    def _write_timings(self) -> None:
        """run.json's `timings`: the base's (written with the folder: seconds, "cached" or
        "given"), then the seconds of row 0, of each experience's training and of its row so far,
        and their total (the sum; loading the stream and building the model are not in it).
        Written right after each row's checkpoint with the seconds it holds (not flushed again),
        so that run.json says exactly what a resume continues from; once more at the end."""
        if not self.is_rank_zero:
            return
        seconds = dict(self.clock.seconds)

        def add(meta: dict[str, Any]) -> None:
            base = meta.get("timings", {}).get("base_pretraining")
            experiences = [
                {"experience": t, "domain": domain, "train": seconds.get(f"exp{t}_train", 0.0),
                 "eval": seconds.get(f"exp{t}_eval", 0.0)}
                for t, domain in enumerate(self.experiences, start=1) if f"exp{t}_train" in seconds
            ]
            before = base if isinstance(base, (int, float)) else 0.0
            meta["timings"] = {"base_pretraining": base, "row0_eval": seconds.get("row0_eval", 0.0),
                               "experiences": experiences, "total": before + sum(seconds.values())}

        update_run_json(self.run_dir, add)

    def _optimizer_state(self) -> dict | None:
        trainer = self.trainer
        if trainer is not None and trainer.optimizers:
            return trainer.optimizers[0].state_dict()
        return self.module.optimizer_state

    def save(self) -> None:
        """Write the resumable checkpoint (rank zero; atomically, so a kill keeps the previous one)."""
        if self.is_rank_zero:
            save_checkpoint(self.ckpt_path, "run", self.module.model.config, {
                "config_hash": self.results.config_hash,
                "model": self.module.model.state_dict(),
                "optimizer": self._optimizer_state(),
                "strategy": self.strategy.state_dict(),
                "results": self.results.to_dict(),
                "position": self.position.state_dict(),
                "seconds": self.clock.state_dict(),
            }, keep_previous=True)
        self.saved_step, self.saved_path = self.position.step, self.ckpt_path
        for cb in self._run_callbacks():
            cb.on_checkpoint(self, self.ckpt_path)

    def _restore(self, path: str | os.PathLike[str]) -> None:
        data, used = load_latest(path, "run", self.module.model.config, say=self.say if self.is_rank_zero else lambda _: None)
        self.saved_path = Path(used)
        if data.get("config_hash") != self.results.config_hash:
            raise RunDirError(f"checkpoint {path} belongs to run {data.get('config_hash')!r}, "
                              f"not to this configuration ({self.results.config_hash})")
        self.module.model.load_state_dict(data["model"])
        self.module.load_optimizer_state(data["optimizer"])
        self.strategy.load_state_dict(data["strategy"])
        # Everything the results held at the checkpoint (matrix, curves, per-document losses, row
        # steps, ...); only the package versions are this process's.
        saved = RunResults.from_dict(data["results"])
        self.results = dataclasses.replace(saved, versions=self.results.versions)
        self.position.load_state_dict(data["position"])
        self.clock.load_state_dict(data.get("seconds", {}))  # checkpoints made before timings: none
        self.saved_step = self.position.step
        if self.position.started:  # in the middle of an experience: its start hook runs again (_start_again)
            self._mid_experience = (data["model"], data["strategy"])


