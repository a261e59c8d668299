"""Elastic weight consolidation (Kirkpatrick et al. 2017) for `finetune` mode: a quadratic pull of
the slow weights towards their values after each past experience, weighted by a diagonal Fisher.

    strategy: {name: ewc, kwargs: {lam: 100.0, fisher_batches: 8, decay: 1.0}}

Fisher: the "batched empirical" estimate Avalanche's EWCPlugin uses, F_i = mean over
`fisher_batches` batches of the experience's adapt segments of (∂ mean LM loss / ∂θ_i)², computed
when the experience ends at its final weights θ*, with the memory restored afterwards (computing
it must not write the fast memory). Online accumulation (Schwarz et al. 2018): F ← decay · F +
F_new and θ* ← the latest weights, one penalty (decay = 1: the sum of every past Fisher).

Penalty (returned as "ewc/penalty"): (lam / 2) · Σ_i F_i (θ_i − θ*_i)², over the trainable dense
parameters (a static PKM's sparse value rows are left out: their gradients are sparse). In `fast`
mode the slow weights are frozen and there is nothing to regularise: an error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cl_platform.strategy import Batch, Strategy, StrategyContext


def _dense_params(model) -> dict[str, torch.nn.Parameter]:
    from cl_platform.memory.pkm import PKM

    sparse = {id(m.values.weight) for m in model.modules() if isinstance(m, PKM) and hasattr(m, "values")}
    return {n: p for n, p in model.named_parameters() if p.requires_grad and id(p) not in sparse}


class EWC(Strategy):
    def __init__(self, lam: float = 100.0, fisher_batches: int = 8, decay: float = 1.0, batch_size: int = 8):
        if not (isinstance(lam, (int, float)) and lam >= 0):
            raise ValueError(f"ewc: lam must be a number >= 0, got {lam!r}")
        if isinstance(fisher_batches, bool) or not isinstance(fisher_batches, int) or fisher_batches < 1:
            raise ValueError(f"ewc: fisher_batches must be a positive int, got {fisher_batches!r}")
        if not (isinstance(decay, (int, float)) and 0 <= decay <= 1):
            raise ValueError(f"ewc: decay must be in [0, 1], got {decay!r}")
        self.lam, self.fisher_batches, self.decay, self.batch_size = float(lam), fisher_batches, float(decay), batch_size
        self.fisher: dict[str, Tensor] = {}
        self.anchor: dict[str, Tensor] = {}

    def check(self, model_config, mode, stream=None) -> None:
        if mode != "finetune":
            raise ValueError("ewc regularises slow weights; in 'fast' mode they are frozen (use cl.mode: finetune)")

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)

    def fisher_of(self, model, batches) -> dict[str, Tensor]:
        """Mean squared gradient of the batch-mean LM loss over `batches` (dicts of input_ids, targets)."""
        params = _dense_params(model)
        fisher = {n: torch.zeros_like(p) for n, p in params.items()}
        memory = model.snapshot_memory()
        was_training = model.training
        model.eval()
        n = 0
        for batch in batches:
            model.zero_grad(set_to_none=True)
            _, loss = model(batch["input_ids"], batch["targets"])
            loss.backward()
            for name, p in params.items():
                if p.grad is not None:
                    fisher[name] += p.grad.detach() ** 2
            n += 1
            model.restore_memory(memory)
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        return {k: v / max(n, 1) for k, v in fisher.items()}

    def consolidate(self, model, batches) -> None:
        new = self.fisher_of(model, batches)
        self.fisher = {k: self.decay * self.fisher[k].to(v.device) + v if k in self.fisher else v for k, v in new.items()}
        self.anchor = {n: p.detach().clone() for n, p in _dense_params(model).items()}

    def on_experience_end(self, ctx: StrategyContext) -> None:
        loader = ctx.require("current", "ewc").adapt_loader(self.batch_size)
        batches = [b for _, b in zip(range(self.fisher_batches), loader)]
        self.consolidate(ctx.model, batches)

    def penalty(self, model) -> Tensor:
        params = _dense_params(model)
        total = next(iter(params.values())).new_zeros(())
        if next(iter(self.anchor.values())).device != total.device:
            # Computed between experiences, where Lightning has moved the model back to the host;
            # the training steps run on the model's device: move once per experience.
            self.fisher = {k: v.to(total.device) for k, v in self.fisher.items()}
            self.anchor = {k: v.to(total.device) for k, v in self.anchor.items()}
        for name, f in self.fisher.items():
            total = total + (f * (params[name] - self.anchor[name]) ** 2).sum()
        return 0.5 * self.lam * total

    def extra_losses(self, batch: Batch, outputs: Any, ctx: StrategyContext) -> dict[str, Tensor]:
        if not self.fisher:
            return {}
        return {"ewc/penalty": self.penalty(ctx.model)}

    def state_dict(self) -> dict[str, Any]:
        return {"fisher": {k: v.detach().cpu().clone() for k, v in self.fisher.items()},
                "anchor": {k: v.detach().cpu().clone() for k, v in self.anchor.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"fisher", "anchor"}:
            raise ValueError(f"ewc: state has keys {sorted(state)}, expected ['anchor', 'fisher']")
        self.fisher = {k: v.clone() for k, v in state["fisher"].items()}
        self.anchor = {k: v.clone() for k, v in state["anchor"].items()}
