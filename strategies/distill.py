"""Fast-to-slow consolidation by distillation: when an experience ends, chosen slow weights learn
to predict, without what the fast memory learned in that experience, what the model predicts with
it, on the experience's own segments; later domains may then overwrite the memory.

    strategy: {name: distill, kwargs: {params: mlp, steps: 20, batch_size: 4, lr: 1.0e-3, after: keep}}

- teacher: the model with its memory as the experience left it (writes off);
- student: the same model with its memory as the experience found it (snapshot at its start;
  writes off), so the slow weights must carry what the memory added;
- loss: per-token KL(teacher ‖ student) (`strategies.lwf.token_kl`, T = 1), `steps` AdamW steps
  (SGD for a static PKM's sparse value rows) on `batch_size` segments drawn from the experience's
  adapt split, seeded; the teacher's logits are computed per step (holding them would take
  segments × T × V floats);
- `params`: which slow weights learn — `mlp` (the dense MLPs), `pkm` (a static PKM's value rows),
  `all` (every slow parameter);
- `after`: `keep` the memory as adapted, or `reset` it to the experience's starting state (the
  consolidated fast content is dropped; the slots are free for later domains).

`fast` mode only (in `finetune` the slow weights learn anyway). The slow weights changed here are
saved with the model in every later checkpoint; the starting-state snapshot is the strategy's
state, so a run resumed mid-experience consolidates the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from cl_platform.device import HOST, model_device
from cl_platform.strategy import Strategy, StrategyContext
from strategies.lwf import token_kl

PARAMS = ("mlp", "pkm", "all")
AFTER = ("keep", "reset")


def chosen_parameters(model, which: str) -> tuple[list, list]:
    """(dense, sparse) parameters that learn under `which`."""
    from cl_platform.memory.pkm import PKM
    from cl_platform.model import MLP

    if which == "mlp":
        dense = [p for m in model.modules() if isinstance(m, MLP) for p in m.parameters()]
        return dense, []
    if which == "pkm":
        return [], [m.values.weight for m in model.modules() if isinstance(m, PKM)]
    sparse = [m.values.weight for m in model.modules() if isinstance(m, PKM)]
    ids = {id(p) for p in sparse}
    return [p for p in model.parameters() if id(p) not in ids], sparse


class Distill(Strategy):
    def __init__(self, params: str = "mlp", steps: int = 20, batch_size: int = 4, lr: float = 1e-3,
                 after: str = "keep", seed: int = 0):
        if params not in PARAMS:
            raise ValueError(f"distill: params must be one of {PARAMS}, got {params!r}")
        if after not in AFTER:
            raise ValueError(f"distill: after must be one of {AFTER}, got {after!r}")
        for name, value in (("steps", steps), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"distill: {name} must be a positive int, got {value!r}")
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"distill: lr must be a number > 0, got {lr!r}")
        self.params, self.steps, self.batch_size, self.lr, self.after, self.seed = params, steps, batch_size, float(lr), after, seed
        self.before = None  # the memory as the current experience found it
        self.losses: list[list[float]] = []  # per consolidation: the KL at every step

    def check(self, model_config, mode, stream=None) -> None:
        if mode != "fast":
            raise ValueError("distill consolidates fast memory into frozen slow weights: 'fast' mode only "
                             "(in 'finetune' the slow weights learn anyway)")
        if not model_config.fwpkm_layers:
            raise ValueError("distill: the model has no FwPKM layer, so there is nothing to consolidate")
        if self.params == "pkm" and not model_config.pkm_layers:
            raise ValueError("distill: params='pkm' needs a static PKM layer (model.pkm_layers is empty); "
                             "use params: mlp or all")
        if self.params == "mlp" and len(model_config.pkm_layers) >= model_config.n_layer:
            raise ValueError("distill: params='mlp' needs an MLP, but every layer's MLP is a PKM; use params: pkm")

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        self.before = ctx.model.snapshot_memory()

    def consolidate(self, model, segments, experience: int = 0) -> list[float]:
        """Train the chosen slow weights on `segments` (a PackedSegments-like sequence of dicts);
        returns the KL at every step. The model's memory ends as `after` says."""
        dense, sparse = chosen_parameters(model, self.params)
        if not dense and not sparse:
            raise ValueError(f"distill: the model has no parameters for params={self.params!r}")
        adapted = model.snapshot_memory()
        trainable = dense + sparse
        flags = [p.requires_grad for p in trainable]
        for p in trainable:
            p.requires_grad_(True)
        opts = ([torch.optim.AdamW(dense, lr=self.lr, weight_decay=0.0)] if dense else []) + \
               ([torch.optim.SGD(sparse, lr=self.lr * 100)] if sparse else [])  # lazy rows want larger steps
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + experience)
        device = model_device(model)
        was_training = model.training
        model.eval()
        model.set_writes(False)
        losses = []
        try:
            for _ in range(self.steps):
                pick = torch.randint(0, len(segments), (min(self.batch_size, len(segments)),), generator=g,
                                     device=HOST)
                rows = [segments[int(i)] for i in pick]
                x = torch.stack([r["input_ids"] for r in rows]).to(device)
                y = torch.stack([r["targets"] for r in rows]).to(device)
                model.restore_memory(adapted)
                with torch.no_grad():
                    teacher = model(x)
                model.restore_memory(self.before)
                loss = token_kl(teacher, model(x), y, 1.0)
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                for opt in opts:
                    opt.step()
                losses.append(float(loss.detach()))
        finally:
            for p, flag in zip(trainable, flags):
                p.requires_grad_(flag)
                p.grad = None
            model.set_writes(True)
            model.train(was_training)
            model.restore_memory(adapted if self.after == "keep" else self.before)
        return losses

    def on_experience_end(self, ctx: StrategyContext) -> None:
        segments = ctx.require("current", "distill").data.segments
        self.losses.append(self.consolidate(ctx.model, segments, ctx.experience))
        self.before = None

    def summary(self) -> dict[str, Any]:
        return {"distill_kl_first_last": [[ls[0], ls[-1]] for ls in self.losses if ls]}

    def state_dict(self) -> dict[str, Any]:
        before = None if self.before is None else [tuple(t.clone() for t in s) for s in self.before]
        return {"before": before, "losses": [list(ls) for ls in self.losses]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"before", "losses"}:
            raise ValueError(f"distill: state has keys {sorted(state)}, expected ['before', 'losses']")
        from cl_platform.memory.fwpkm import FastWeightState

        self.before = None if state["before"] is None else [FastWeightState(*s) for s in state["before"]]
        self.losses = [list(ls) for ls in state["losses"]]
