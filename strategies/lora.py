"""Low-rank adaptation (LoRA, Hu et al. 2021) as a continual-learning baseline in `finetune` mode:
every slow weight stays as pretrained except that each chosen matrix W learns only through a
rank-r update, W = W₀ + B·A ("LoRA learns less and forgets less", Biderman et al. 2024).

    strategy: {name: lora, kwargs: {rank: 8, params: mlp, lr: 1.0e-3, grad_clip: 1.0}}

- `params`: the matrices that get factors — `mlp` (the dense MLPs' two matrices per layer) or
  `all` (every 2-D slow weight: attention, MLPs, the tied embedding, the FwPKM query and gate
  projections); vectors (norms) never move, nor a static PKM's sparse value rows;
- A (r × in) is drawn uniform in ±1/√in from a generator seeded by `seed`, B (out × r) is zero,
  so the model starts as pretrained; one pair per matrix, created at the first experience and
  trained over the whole stream (one adapter, as in continued pretraining with LoRA);
- `lr`, `grad_clip`: the factors' own AdamW (no weight decay) and the clipping of their joint
  gradient norm (0 = off). LoRA wants larger steps than full finetuning; choose `lr` on dev.

How, without adding a module to the model: the model always holds W = W₀ + B·A, so the engine's
backward computes ∂L/∂W and the factors' gradients follow by the chain rule, ∂L/∂B = ∂L/∂W·Aᵀ and
∂L/∂A = Bᵀ·∂L/∂W. `after_backward` takes the factors' AdamW step, writes W = W₀ + B·A back and
clears every slow gradient, so the outer optimiser steps nothing. Checkpoints hold W; the
strategy's state holds W₀, A, B and their AdamW state, so a resumed run continues bit for bit and
evaluation needs no hook. What it costs: the backward still computes the dense ∂L/∂W (full
finetuning's compute); what it saves is optimiser state (2·r·(in + out) floats a matrix against
2·in·out) and, by design, what the update can move.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from cl_platform.strategy import Strategy, StrategyContext

PARAMS = ("mlp", "all")


def init_factors(w: Tensor, rank: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """LoRA's starting factors of a matrix W (out × in), on W's device: A (r × in) uniform in
    ±1/√in, B (out × r) zero, r = min(rank, out, in); B·A = 0, so the model starts as it was."""
    rows, cols = w.shape
    r = min(rank, rows, cols)
    a = (torch.rand(r, cols, generator=generator, dtype=w.dtype) * 2 - 1) / math.sqrt(cols)
    return a.to(w.device), torch.zeros(rows, r, dtype=w.dtype, device=w.device)


def target_matrices(model, which: str) -> dict[str, torch.nn.Parameter]:
    """{name: W} for every 2-D slow weight of `which` (a static PKM's value table excluded)."""
    from cl_platform.memory.pkm import PKM
    from cl_platform.model import MLP

    if which == "mlp":
        ids = {id(p) for m in model.modules() if isinstance(m, MLP) for p in m.parameters()}
    else:
        sparse = {id(m.values.weight) for m in model.modules() if isinstance(m, PKM)}
        ids = {id(p) for p in model.parameters() if id(p) not in sparse}
    return {n: p for n, p in model.named_parameters() if id(p) in ids and p.ndim == 2}


class LoRA(Strategy):
    def __init__(self, rank: int = 8, params: str = "mlp", lr: float = 1e-3, grad_clip: float = 1.0, seed: int = 0):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"lora: rank must be a positive int, got {rank!r}")
        if params not in PARAMS:
            raise ValueError(f"lora: params must be one of {PARAMS}, got {params!r}")
        if isinstance(lr, bool) or not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"lora: lr must be a number > 0, got {lr!r}")
        if isinstance(grad_clip, bool) or not (isinstance(grad_clip, (int, float)) and grad_clip >= 0):
            raise ValueError(f"lora: grad_clip must be a number >= 0 (0: off), got {grad_clip!r}")
        self.rank, self.params, self.lr, self.grad_clip, self.seed = rank, params, float(lr), float(grad_clip), seed
        self.base: dict[str, Tensor] = {}  # W₀ of every target matrix
        self.a: dict[str, Tensor] = {}
        self.b: dict[str, Tensor] = {}
        self.opt: torch.optim.AdamW | None = None
        self._opt_state: dict[str, Any] | None = None  # a resumed AdamW state, until the factors are in place

    def check(self, model_config, mode, stream=None) -> None:
        if mode != "finetune":
            raise ValueError("lora trains slow weights through low-rank factors; in 'fast' mode they are frozen "
                             "(use cl.mode: finetune)")
        if self.params == "mlp" and len(model_config.pkm_layers) >= model_config.n_layer:
            raise ValueError("lora: params='mlp' needs an MLP, but every layer's MLP is a PKM; use params: all")

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        if self.a:
            return  # one adapter over the whole stream
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7)
        for name, w in target_matrices(ctx.model, self.params).items():
            self.base[name] = w.detach().clone()
            self.a[name], self.b[name] = init_factors(w.detach(), self.rank, g)
        self._build_optimizer()

    def _factors(self) -> list[Tensor]:
        return [t for n in sorted(self.a) for t in (self.a[n], self.b[n])]

    def _build_optimizer(self) -> None:
        for t in self._factors():
            t.requires_grad_(True)
        self.opt = torch.optim.AdamW(self._factors(), lr=self.lr, weight_decay=0.0)
        if self._opt_state is not None:
            self.opt.load_state_dict(self._opt_state)
            self._opt_state = None

    def _to(self, device) -> None:
        # Factors made or loaded between fits live on the host; the step runs where the model is.
        if next(iter(self.a.values())).device == device:
            return
        state = self.opt.state_dict()
        for d in (self.base, self.a, self.b):
            for n in d:
                d[n] = d[n].detach().to(device)
        self._opt_state = state
        self._build_optimizer()

    def after_backward(self, ctx: StrategyContext) -> None:
        weights = dict(ctx.model.named_parameters())
        self._to(weights[next(iter(self.a))].device)
        with torch.no_grad():
            for name in self.a:
                grad = weights[name].grad
                if grad is None:
                    grad = torch.zeros_like(weights[name])
                self.b[name].grad = grad @ self.a[name].T
                self.a[name].grad = self.b[name].T @ grad
            if self.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self._factors(), self.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            for name in self.a:
                weights[name].copy_(self.base[name] + self.b[name] @ self.a[name])
        for p in ctx.model.parameters():  # the outer optimiser steps nothing
            p.grad = None

    def summary(self) -> dict[str, Any]:
        return {"rank": self.rank, "matrices": len(self.a),
                "trainable_params": sum(t.numel() for t in self._factors()),
                "update_norm": {n: float((self.b[n] @ self.a[n]).detach().norm()) for n in sorted(self.a)}}

    def state_dict(self) -> dict[str, Any]:
        cpu = lambda d: {k: v.detach().cpu().clone() for k, v in d.items()}  # noqa: E731
        return {"base": cpu(self.base), "a": cpu(self.a), "b": cpu(self.b),
                "optimizer": self.opt.state_dict() if self.opt is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"base", "a", "b", "optimizer"}:
            raise ValueError(f"lora: state has keys {sorted(state)}, expected ['a', 'b', 'base', 'optimizer']")
        self.base = {k: v.clone() for k, v in state["base"].items()}
        self.a = {k: v.clone() for k, v in state["a"].items()}
        self.b = {k: v.clone() for k, v in state["b"].items()}
        self.opt, self._opt_state = None, state["optimizer"]
        if self.a:
            self._build_optimizer()
