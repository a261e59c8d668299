"""Learning without forgetting (Li & Hoiem 2016) for `finetune` mode, per token: the model as it
was when the experience began is the teacher, and its next-token distribution is distilled into
the training model on the new domain's own text.

    strategy: {name: lwf, kwargs: {alpha: 1.0, temperature: 2.0}}

Loss (returned as "lwf/kl"): alpha · T² · mean over target tokens of
KL(softmax(z_teacher / T) ‖ softmax(z_student / T)), the T² keeping the soft-target gradients on
the scale of the hard loss (Hinton et al. 2015). The teacher is a frozen copy taken at each
experience start from the second on, with its fast memory as it was then and writes off (it
reads, never learns). In `fast` mode the slow weights are frozen: an error.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from cl_platform.constants import IGNORE_INDEX
from cl_platform.device import model_device
from cl_platform.strategy import Batch, Strategy, StrategyContext


def token_kl(teacher_logits: Tensor, student_logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """T² · mean over tokens with a target of KL(p_teacher ‖ p_student) at temperature T."""
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(-1)  # (B, T)
    mask = targets != IGNORE_INDEX
    return temperature ** 2 * kl[mask].mean()


class LwF(Strategy):
    def __init__(self, alpha: float = 1.0, temperature: float = 2.0):
        if not (isinstance(alpha, (int, float)) and alpha >= 0):
            raise ValueError(f"lwf: alpha must be a number >= 0, got {alpha!r}")
        if not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"lwf: temperature must be a number > 0, got {temperature!r}")
        self.alpha, self.temperature = float(alpha), float(temperature)
        self.teacher = None
        self._pending: dict[str, Any] | None = None  # a resumed teacher's weights, until a model is at hand

    def check(self, model_config, mode, stream=None) -> None:
        if mode != "finetune":
            raise ValueError("lwf distils into slow weights; in 'fast' mode they are frozen (use cl.mode: finetune)")

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        if ctx.experience >= 2:
            self.teacher = self._freeze(copy.deepcopy(ctx.model))

    @staticmethod
    def _freeze(model):
        model.eval()
        model.set_writes(False)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def extra_losses(self, batch: Batch, outputs: Any, ctx: StrategyContext) -> dict[str, Tensor]:
        if self.teacher is None and self._pending is not None:
            # Resumed mid-experience: the teacher is a copy of the model's architecture holding
            # the saved teacher's weights and fast state.
            self.teacher = self._freeze(copy.deepcopy(ctx.model))
            self.teacher.load_state_dict(self._pending)
            self._pending = None
        if self.teacher is None:
            return {}
        # The copy was taken between fits, on the host; the student is wherever Lightning put it.
        device = batch["input_ids"].device
        if model_device(self.teacher) != device:
            self.teacher.to(device)
        with torch.no_grad():
            teacher_logits = self.teacher(batch["input_ids"])
        return {"lwf/kl": self.alpha * token_kl(teacher_logits, outputs["logits"], batch["targets"], self.temperature)}

    def state_dict(self) -> dict[str, Any]:
        if self.teacher is None:
            return {"teacher": self._pending}
        return {"teacher": {k: v.clone() for k, v in self.teacher.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"teacher"}:
            raise ValueError(f"lwf: state has keys {sorted(state)}, expected ['teacher']")
        self._pending = state["teacher"]
        self.teacher = None
