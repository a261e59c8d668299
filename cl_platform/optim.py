"""MixedAdamW: AdamW for dense parameters, lazy Adam for parameters with sparse gradients.

torch.optim.AdamW rejects sparse gradients and torch.optim.SparseAdam rejects dense ones; a model
with a static PKM has both (the value table is an `EmbeddingBag(sparse=True)`). Each param group
carries `sparse: bool`:

- dense groups: the AdamW update (decoupled weight decay, bias-corrected moments), the same
  arithmetic as torch.optim.AdamW, for all of a group's tensors at once (`torch._foreach_*`: on a
  GPU a few multi-tensor kernels per group instead of ~8 launches per tensor; on the CPU the same
  per-tensor kernels, bit for bit the per-tensor loop);
- sparse groups: the lazy Adam update of torch.optim.SparseAdam: the gradient is coalesced and
  only the touched rows of the parameter and of its moments change. Rows that were not read keep
  stale moments instead of decaying them, which is what makes a step cost O(rows read) instead of
  O(table). Weight decay is refused there (decaying only the touched rows would shrink often-read
  rows more than the rest, which is not what "weight decay" means).

The step count is per parameter in both cases, as in torch.
"""

import math

import torch
from torch import Tensor
from torch.optim import Optimizer


class MixedAdamW(Optimizer):
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        sparse: bool = False,
    ):
        if lr < 0:
            raise ValueError(f"MixedAdamW lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"MixedAdamW betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"MixedAdamW eps must be >= 0, got {eps}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, sparse=sparse)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["sparse"] and group["weight_decay"] != 0:
                name = group.get("name", "<unnamed>")
                raise ValueError(
                    f"MixedAdamW param group {name!r}: weight_decay must be 0 when sparse=True, "
                    f"got {group['weight_decay']}"
                )

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            dense: list[tuple[Tensor, dict]] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse != group["sparse"]:
                    kind = "sparse" if p.grad.is_sparse else "dense"
                    raise RuntimeError(
                        f"MixedAdamW param group {group.get('name', '<unnamed>')!r} has "
                        f"sparse={group['sparse']} but a parameter of shape {tuple(p.shape)} got a "
                        f"{kind} gradient"
                    )
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["sparse"]:
                    _lazy_adam(p, p.grad, state, group)
                else:
                    dense.append((p, state))
            if dense:
                _adamw(dense, group)
        return loss


def _adamw(params: list[tuple[Tensor, dict]], group: dict) -> None:
    """One AdamW step of every (parameter, its state) of a dense group, as multi-tensor ops. The
    step count is per parameter (one skipped for want of a gradient lags), so the bias
    corrections are per-tensor scalars."""
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
    ps = [p for p, _ in params]
    grads = [p.grad for p in ps]
    ms = [state["exp_avg"] for _, state in params]
    vs = [state["exp_avg_sq"] for _, state in params]
    for _, state in params:
        state["step"] += 1
    steps = [state["step"] for _, state in params]
    torch._foreach_mul_(ps, 1 - lr * group["weight_decay"])
    torch._foreach_lerp_(ms, grads, 1 - beta1)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, [math.sqrt(1 - beta2**step) for step in steps])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(ps, ms, denom, [-lr / (1 - beta1**step) for step in steps])


def _lazy_adam(p: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
    # The update is non-linear in the gradient, so rows read several times must be summed first.
    grad = grad.coalesce()
    if grad.sparse_dim() != 1:
        raise RuntimeError(
            f"MixedAdamW sparse groups take row-sparse gradients (sparse_dim 1, as from "
            f"nn.Embedding/EmbeddingBag), got sparse_dim {grad.sparse_dim()}"
        )
    rows, g = grad.indices()[0], grad.values()  # (n,), (n, ...)
    state["step"] += 1
    step = state["step"]
    if rows.numel() == 0:
        return
    m = state["exp_avg"].index_select(0, rows).lerp_(g, 1 - beta1)
    v = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(g, g, value=1 - beta2)
    state["exp_avg"].index_copy_(0, rows, m)
    state["exp_avg_sq"].index_copy_(0, rows, v)
    # SparseAdam's placement of eps (on sqrt(v) before bias correction), kept to match it.
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    p.index_add_(0, rows, m.div_(v.sqrt_().add_(eps)), alpha=-step_size)
