"""The LightningModule around an FwPKM language model: how it learns, the strategy hooks, evaluation.

    module = LMModule(model, phase="fast", strategy=NaiveStrategy(), memory_policy=FrozenMemory())
    module.begin_experience(ctx, label="exp 1/4 math")   # the strategy context and progress label
    trainer.fit(module, train_dataloaders=loader)        # one experience (see cl_platform.engine)
    trainer.validate(module, dataloaders=eval_loaders)   # module.last_eval = {domain: loss/token}

Phases (what one training batch does):
    pretrain  slow weights trained through the fast-weight writes (docs/fwpkm.md, "Training
              through the writes"); no strategy.
    fast      the paper's continual-learning protocol: slow weights frozen, the forward runs
              without a graph and the FwPKM layers write in place. No optimiser exists, so
              Lightning's `global_step` stays 0: progress is counted in `self.position`.
    finetune  as pretrain, plus the strategy's extra loss terms.

Strategy hooks are called in the order documented in `cl_platform.strategy`; in fast mode
`extra_losses` and `after_backward` are not called (no optimiser step). The loss terms a strategy
returns are summed with the LM loss and each is reported under its own name in `last_losses`.
Optimisation is manual (`automatic_optimization = False`) so that one step function covers all
three phases and the learning rate is a function of the run step, which survives fresh Trainers.

The run's position (`RunPosition`: step, segments of the current experience done, whether the
experience has started) is one value the runner and the module share: the module advances it,
the runner starts and ends experiences and checkpoints it with `state_dict`.

Every training batch first reseeds torch's global generator from (seed, step): randomness in the
model (pSWA draws, dropout) and in strategies is then a function of the position in the run,
so a resumed run draws exactly what an uninterrupted one would have.

Evaluation sums the token cross-entropy and counts tokens per domain, so the per-token mean is
exact whatever the batch size; the memory policy (cl_platform.memory_policy) wraps every
evaluation, in Lightning's validation loop and in `evaluate` alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from cl_platform.constants import IGNORE_INDEX, PRECISIONS, Precision
from cl_platform.device import model_device, to_device
from cl_platform.memory.fwpkm import NonFiniteWriteError
from cl_platform.memory_policy import EvalMemoryPolicy, FrozenMemory, MemorySession
from cl_platform.model import FwPKMLM
from cl_platform.optim import MixedAdamW
from cl_platform.strategy import Strategy, StrategyContext

Phase = Literal["pretrain", "fast", "finetune"]


@dataclass
class RunPosition:
    """Where a run stands; what a checkpoint needs to continue the data exactly where it stopped."""

    step: int = 0  # training batches so far in the whole run, across Trainers and resumes
    segments_done: int = 0  # segments of the current experience trained on (data position)
    started: bool = False  # the current experience's start hooks have run

    def start_experience(self) -> None:
        self.started, self.segments_done = True, 0

    def end_experience(self) -> None:
        self.started, self.segments_done = False, 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.segments_done, self.started = int(state["step"]), int(state["segments_done"]), bool(state["started"])


class NonFiniteLossError(FloatingPointError):
    """A training loss (or a fast-weight write) was NaN/inf; `step` is the run step it happened at."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


@dataclass
class OptimSettings:
    """Outer optimiser (MixedAdamW): lr with linear warm-up, then constant or cosine decay."""

    lr: float
    weight_decay: float = 0.0
    grad_clip: float = 0.0  # max global norm of the dense gradients; 0 = no clipping
    warmup_steps: int = 0
    decay_steps: int | None = None  # cosine from lr to lr·min_lr_ratio at this step; None = constant
    min_lr_ratio: float = 1.0

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.decay_steps is None:
            return self.lr
        span = max(1, self.decay_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        floor = self.lr * self.min_lr_ratio
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * progress))


def precision_note(precision: str, field: str) -> str | None:
    """A warning when bf16-mixed (the value of `field`) will be slow here: a CPU without native
    bfloat16 emulates it."""
    if precision != "bf16-mixed" or torch.cuda.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    # Measured on an AVX2-only AMD EPYC (2026-12-04): a bf16 matmul 36x slower than float32, a
    # reference-base pretraining step 160 s instead of 3.4-4.8 s on CPUs with avx512_bf16 or AMX.
    return (f"{field}: bf16-mixed, but this CPU has no native bfloat16 (no avx512_bf16 or AMX), which makes bf16 "
            f"matmuls tens of times slower than float32 (36x on an AVX2-only EPYC); set {field}=32-true "
            "(results then differ from bf16 runs), or run on a GPU")


def step_seed(seed: int, step: int) -> int:
    """A 63-bit seed for (seed, step): distinct steps of distinct runs get unrelated streams."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 1) % (2**63)


class LMModule(L.LightningModule):
    def __init__(
        self,
        model: FwPKMLM,
        phase: Phase,
        optim: OptimSettings | None = None,
        strategy: Strategy | None = None,
        memory_policy: EvalMemoryPolicy | None = None,
        seed: int = 0,
        eval_domains: list[str] | None = None,
        position: RunPosition | None = None,
        precision: Precision = "32-true",
        sequences_per_forward: int = 0,
    ):
        super().__init__()
        if phase not in ("pretrain", "fast", "finetune"):
            raise ValueError(f"LMModule.phase must be 'pretrain', 'fast' or 'finetune', got {phase!r}")
        if isinstance(sequences_per_forward, bool) or not isinstance(sequences_per_forward, int) or sequences_per_forward < 0:
            raise ValueError(f"LMModule.sequences_per_forward must be an int >= 0, got {sequences_per_forward!r}")
        if sequences_per_forward and phase != "pretrain":
            raise ValueError(f"LMModule.sequences_per_forward is for phase 'pretrain' (no strategy), not {phase!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"LMModule.precision must be one of {list(PRECISIONS)}, got {precision!r}")
        if phase != "fast" and optim is None:
            raise ValueError(f"LMModule: phase {phase!r} trains slow weights and needs OptimSettings")
        self.automatic_optimization = False
        self.model = model
        self.phase = phase
        self.optim = optim
        self.strategy = strategy if strategy is not None else Strategy()
        self.memory_policy = memory_policy if memory_policy is not None else FrozenMemory()
        self.seed = seed
        self.precision = precision
        # 0: a training batch is one forward, so its sequences read and write one memory (the
        # layer's state has no batch dimension). k > 0: k sequences a forward, gradients summed
        # into one optimiser step; under `persistence: reset_per_call` every group of k then has
        # a memory of its own, as at evaluation: episodic training without cross-talk (with
        # 64 shared keys, 32 sequences in one memory left associative recall at chance).
        self.sequences_per_forward = sequences_per_forward
        self.eval_domains = list(eval_domains or [])
        self.position = position if position is not None else RunPosition()
        self.ctx: StrategyContext | None = None  # the current experience's, from begin_experience
        self.progress_label = phase  # shown by the progress bar
        self.last_losses: dict[str, float] = {}
        # The outer optimiser's state outlives each Trainer: one AdamW over the whole run.
        self.optimizer_state: dict[str, Any] | None = None
        self.last_eval: dict[str, float] = {}
        # Off while the runner reads a row with the memory put back to the base's (engine.py).
        self.route_eval = True
        self.last_eval_docs: dict[str, list[list[float]]] = {}
        self._doc_sums: dict[int, tuple[Tensor, Tensor]] = {}
        self._session: MemorySession | None = None
        self._sums: dict[int, list[float]] = {}
        model.set_writes(True)
        for p in model.parameters():
            # Fast mode: slow weights are frozen, so nothing can train them by accident.
            p.requires_grad_(phase != "fast")

    def autocast(self) -> torch.autocast:
        """The forward passes' precision context (backward runs outside it, as autocast wants)."""
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed")

    def begin_experience(self, ctx: StrategyContext, label: str) -> None:
        """The strategy context the next training batches see, and the progress bar's label."""
        self.ctx, self.progress_label = ctx, label

    def load_optimizer_state(self, state: dict[str, Any] | None) -> None:
        """Optimiser state from a checkpoint; loaded into the next Trainer's optimiser."""
        self.optimizer_state = state

    # --- optimisation -----------------------------------------------------------------------
    def configure_optimizers(self):
        if self.phase == "fast":
            return None
        return MixedAdamW(self.model.optimizer_groups(self.optim.weight_decay, self.optim.lr_at(self.position.step)))

    def on_train_start(self) -> None:
        if self.phase != "fast" and self.optimizer_state is not None:
            self.trainer.optimizers[0].load_state_dict(self.optimizer_state)

    def on_train_end(self) -> None:
        if self.phase != "fast":
            self.optimizer_state = self.trainer.optimizers[0].state_dict()

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        pos = self.position
        torch.manual_seed(step_seed(self.seed, pos.step))
        ctx = self.ctx
        use_strategy = self.phase != "pretrain" and ctx is not None
        # The stream's own segments in this batch, before a strategy appends any (replay): the
        # data position counts only these, so a resumed run continues where the stream stopped.
        streamed = batch["input_ids"].shape[0]
        if use_strategy:
            ctx.global_step = pos.step
            batch = self.strategy.transform_batch(batch, ctx)
        x, y = batch["input_ids"], batch["targets"]  # (B, T)
        try:
            if self.phase == "fast":
                stats = self._fast_step(x, y, ctx if use_strategy else None)
            else:
                stats = self._gradient_step(batch, x, y, ctx if use_strategy else None)
        except NonFiniteWriteError as err:
            raise NonFiniteLossError(f"step {pos.step + 1}: {err}", pos.step + 1) from None
        world = self.trainer.world_size if self._trainer is not None else 1
        pos.step += 1
        pos.segments_done += streamed * world
        self.last_losses = stats
        self.log("loss", stats["lm"], prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=x.shape[0])

    def _fast_step(self, x: Tensor, y: Tensor, ctx: StrategyContext | None) -> dict[str, float]:
        self.model.eval()  # adaptation is inference: no dropout, no pSWA draws
        with torch.no_grad(), self.autocast():
            _, lm = self.model(x, y)
        if ctx is not None:
            self.strategy.after_write(ctx)
        self._check_finite({"lm": lm})
        return {"lm": float(lm)}

    def _gradient_step(self, batch: Any, x: Tensor, y: Tensor, ctx: StrategyContext | None) -> dict[str, float]:
        opt = self.optimizers()
        lr = self.optim.lr_at(self.position.step)
        for group in opt.param_groups:
            group["lr"] = lr
        self.model.train()
        if self.sequences_per_forward and ctx is None:
            return self._grouped_step(opt, x, y, lr)
        with self.autocast():
            logits, lm = self.model(x, y)
        losses: dict[str, Tensor] = {"lm": lm.float()}
        if ctx is not None:
            self.strategy.after_write(ctx)
            with self.autocast():
                extra = self.strategy.extra_losses(batch, {"logits": logits, "lm_loss": lm}, ctx)
            if "lm" in extra:
                raise ValueError("a strategy returned a loss named 'lm', which is the language-model loss")
            losses.update(extra)
        total = torch.stack([v.reshape(()) for v in losses.values()]).sum()
        self._check_finite({**losses, "total": total})
        opt.zero_grad(set_to_none=True)
        self.manual_backward(total)
        if ctx is not None:
            self.strategy.after_backward(ctx)
        grad_norm = self._clip_gradients()
        opt.step()
        stats = {name: float(v.detach()) for name, v in losses.items()}
        stats.update(total=float(total.detach()), lr=lr, grad_norm=grad_norm)
        return stats

    def _grouped_step(self, opt: Any, x: Tensor, y: Tensor, lr: float) -> dict[str, float]:
        """One optimiser step over the batch read `sequences_per_forward` sequences at a time.
        Each group's mean loss is weighted by its share of the batch's target tokens, so the
        summed gradient is that of the batch's token mean, as in a single forward."""
        k = self.sequences_per_forward
        counts = (y != IGNORE_INDEX).sum(dim=1)
        total = int(counts.sum())
        opt.zero_grad(set_to_none=True)
        lm_mean = 0.0
        for start in range(0, x.shape[0], k):
            share = int(counts[start:start + k].sum()) / max(total, 1)
            if share == 0:
                continue  # a group with no targets has no loss (cross-entropy would be NaN)
            with self.autocast():
                _, lm = self.model(x[start:start + k], y[start:start + k])
            self._check_finite({"lm": lm.float()})
            self.manual_backward(lm.float() * share)
            lm_mean += float(lm.detach()) * share
        grad_norm = self._clip_gradients()
        opt.step()
        return {"lm": lm_mean, "total": lm_mean, "lr": lr, "grad_norm": grad_norm}

    def _clip_gradients(self) -> float:
        # Sparse gradients (a static PKM's value rows) are left out: their norm is not defined
        # by torch's clipping, and lazy Adam already bounds each touched row's step.
        dense = [p for p in self.model.parameters() if p.grad is not None and not p.grad.is_sparse]
        if not dense:
            return 0.0
        max_norm = self.optim.grad_clip if self.optim.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(dense, max_norm))

    def _check_finite(self, losses: dict[str, Tensor]) -> None:
        bad = {name: float(v.detach()) for name, v in losses.items() if not bool(torch.isfinite(v.detach()).all())}
        if bad:
            where = f" (experience {self.ctx.experience}: {self.ctx.domain})" if self.ctx is not None else ""
            step = self.position.step + 1
            raise NonFiniteLossError(f"non-finite loss at step {step}{where}: {bad}", step)

    # --- evaluation ---------------------------------------------------------------------------
    def token_loss_sum(self, batch: dict[str, Tensor]) -> tuple[float, int]:
        """(Σ token cross-entropy, number of tokens) of one batch; padding (-100) excluded."""
        total, count, _ = self._token_losses(batch)
        return total, count

    def _token_losses(self, batch: dict[str, Tensor]) -> tuple[float, int, Tensor]:
        """(Σ token cross-entropy, number of tokens, per-token losses (B·T,)) of one batch.
        cross_entropy is log_softmax then nll_loss: computed so, the sum is bit for bit the
        fused one and the per-token losses come at no second softmax."""
        x, y = batch["input_ids"], batch["targets"]
        with self.autocast():
            logits = self.model(x)
        logp = F.log_softmax(logits.float().flatten(0, 1), dim=-1)  # (B·T, V)
        total = F.nll_loss(logp, y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        per_token = F.nll_loss(logp, y.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
        return float(total), int((y != IGNORE_INDEX).sum()), per_token

    def on_validation_start(self) -> None:
        self._session = self.memory_policy.open(self.model)
        self._sums = {}
        self._doc_sums = {}

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if batch_idx == 0:
            name = self.eval_domains[dataloader_idx] if self.eval_domains else str(dataloader_idx)
            self._session.start_domain(self._routed_memory(name))

    def _routed_memory(self, domain: str):
        """The memory the strategy routes `domain`'s evaluation to (`Strategy.eval_memory`), unless
        `route_eval` is off: then every domain reads the memory the model holds."""
        return self.strategy.eval_memory(domain) if self.route_eval else None

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        loss_sum, count, per_token = self._token_losses(batch)
        acc = self._sums.setdefault(dataloader_idx, [0.0, 0])
        acc[0] += loss_sum
        acc[1] += count
        if "doc_index" in batch:
            # Per document of the split (a target belongs to its input token's document), so that
            # intervals can resample documents (analysis/bootstrap.py).
            valid = batch["targets"].flatten() != IGNORE_INDEX
            doc = batch["doc_index"].flatten()[valid]
            sums = torch.bincount(doc, weights=per_token[valid].double())
            counts = torch.bincount(doc)
            prev_sums, prev_counts = self._doc_sums.get(dataloader_idx, (sums.new_zeros(0), counts.new_zeros(0)))
            n = max(len(prev_sums), len(sums))
            self._doc_sums[dataloader_idx] = (
                F.pad(prev_sums, (0, n - len(prev_sums))) + F.pad(sums, (0, n - len(sums))),
                F.pad(prev_counts, (0, n - len(prev_counts))) + F.pad(counts, (0, n - len(counts))),
            )

    def on_validation_epoch_end(self) -> None:
        names = self.eval_domains or [str(i) for i in sorted(self._sums)]
        self.last_eval = {
            name: (self._sums[i][0] / self._sums[i][1]) if i in self._sums and self._sums[i][1] else math.nan
            for i, name in enumerate(names)
        }
        # [Σ loss, tokens] per document of each domain's split, documents in split order.
        self.last_eval_docs = {
            name: [[float(a), int(b)] for a, b in zip(*self._doc_sums[i])] if i in self._doc_sums else []
            for i, name in enumerate(names)
        }
        for name, value in self.last_eval.items():
            # For callbacks that read trainer.callback_metrics (e.g. an Optuna pruner); the
            # runner logs to TensorBoard itself, at its own step.
            self.log(f"eval/{name}/loss", value, logger=False, add_dataloader_idx=False)
        self.log("eval/mean_loss", mean_loss(self.last_eval.values()), logger=False, add_dataloader_idx=False)

    def on_validation_end(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def evaluate(self, loaders: dict[str, Any]) -> dict[str, float]:
        """Per-token loss on each domain's loader under the memory policy, outside Lightning's
        loops (forgetting curves run in the middle of a training epoch, at the run's own step)."""
        was_training = self.model.training
        self.model.eval()
        device = model_device(self.model)  # in the middle of a fit: Lightning's, the loaders' are on the host
        session = self.memory_policy.open(self.model)
        out = {}
        try:
            with torch.no_grad():
                for name, loader in loaders.items():
                    session.start_domain(self._routed_memory(name))
                    loss_sum, count = 0.0, 0
                    for batch in loader:
                        s, n = self.token_loss_sum(to_device(batch, device))
                        loss_sum, count = loss_sum + s, count + n
                    out[name] = loss_sum / count if count else math.nan
        finally:
            session.close()
            self.model.train(was_training)
        return out

    # --- what logging callbacks read ------------------------------------------------------------
    def fwpkm_stats(self) -> dict[str, float]:
        """Per FwPKM layer: gate mean and write magnitudes of the last call, and addressing health
        (coverage, collision rate, KL to uniform) over reads since the read counts were reset."""
        stats = {}
        for layer in self.model.fwpkm_layers():
            for key, value in {**layer.last_stats, **layer.usage_stats()}.items():
                stats[f"{layer.name}/{key}"] = value
        return stats


def mean_loss(values) -> float:
    """Mean over domains of the measured (non-NaN) losses; NaN when none was measured."""
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan
