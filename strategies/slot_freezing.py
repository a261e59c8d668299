"""Slot freezing: after each experience, the FwPKM slots the finished domain used most
specifically stop taking writes (reads stay allowed), so later domains cannot overwrite them.

    strategy: {name: slot_freezing, kwargs: {fraction: 0.02, budget: 0.25, score: tfidf}}

Scores, per FwPKM layer, from the read counts of the experience just finished (`read_counts`,
cleared by the runner at each experience start), over the slots it read and that are still
writable:

- `usage`: the read count c(i);
- `tfidf` (sparse memory fine-tuning, Lin et al. 2025): tf(i) = c(i) / Σ_j c(j) times
  idf(i) = ln((D + 1) / (df(i) + 1)) + 1, where D is the number of other experiences recorded so
  far (the background) and df(i) how many of them read slot i. The paper's idf has no "+ 1";
  with it, the first experience (no background yet) ranks by usage instead of scoring every slot
  0, and later ones still prefer slots the background did not use.

The top `fraction` of each layer's slots by score are frozen (`write_mask` False), within a
total of `budget` of the layer's slots over the whole stream; ties break towards the lower slot
id. Works in `fast` and `finetune` mode (the memory writes in both). `owned()` says how many
frozen slots each domain owns per layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from cl_platform.device import HOST
from cl_platform.strategy import Strategy, StrategyContext

SCORES = ("tfidf", "usage")


def slot_scores(counts: torch.Tensor, background: list[torch.Tensor], score: str) -> torch.Tensor:
    """Score of every slot from an experience's read counts (N,) and the background's (the
    earlier experiences' counts); `score` is one of SCORES (module docstring). Slot transfer
    ranks by the same scores."""
    c = counts.double()
    if score == "usage":
        return c
    tf = c / c.sum().clamp(min=1)
    df = sum(((b > 0).double() for b in background), torch.zeros_like(c))
    idf = torch.log((len(background) + 1) / (df + 1)) + 1
    return tf * idf


def check_slot_choice(name: str, fraction, budget, score) -> None:
    """The arguments every slot-choosing strategy takes (slot freezing, slot transfer)."""
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"{name}: fraction must be in (0, 1], got {fraction!r}")
    if not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        raise ValueError(f"{name}: budget must be in (0, 1], got {budget!r}")
    if score not in SCORES:
        raise ValueError(f"{name}: score must be one of {SCORES}, got {score!r}")


class SlotFreezing(Strategy):
    def __init__(self, fraction: float = 0.02, budget: float = 0.25, score: str = "tfidf"):
        check_slot_choice("slot_freezing", fraction, budget, score)
        self.fraction, self.budget, self.score = float(fraction), float(budget), score
        self.history: list[dict[str, Any]] = []  # per finished experience: domain and per-layer read counts
        self.owner: dict[str, torch.Tensor] = {}  # per layer: (N,) int, experience index that froze the slot, -1 none

    # --- scoring ------------------------------------------------------------------------------
    def scores(self, counts: torch.Tensor, background: list[torch.Tensor]) -> torch.Tensor:
        """Score of every slot from this experience's read counts and the background's."""
        return slot_scores(counts, background, self.score)

    def check(self, model_config, mode, stream=None) -> None:
        if not model_config.fwpkm_layers:
            raise ValueError("slot_freezing: the model has no FwPKM layer, so there are no slots to freeze")

    def on_experience_end(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        layers = ctx.model.fwpkm_layers()
        record = {"domain": ctx.domain, "experience": ctx.experience, "counts": {}}
        for layer in layers:
            n = layer.config.num_slots
            counts = layer.read_counts.detach().to(HOST).clone()  # the bookkeeping is host-side
            record["counts"][layer.name] = counts
            owner = self.owner.setdefault(layer.name, torch.full((n,), -1, dtype=torch.long, device=HOST))
            background = [h["counts"][layer.name] for h in self.history]
            score = self.scores(counts, background)
            eligible = (counts > 0) & layer.write_mask.to(HOST)
            room = math.floor(self.budget * n) - int((owner >= 0).sum())
            k = min(math.floor(self.fraction * n), room, int(eligible.sum()))
            if k <= 0:
                continue
            score = torch.where(eligible, score, torch.full_like(score, -math.inf))
            # Stable sort on the negated score: ties keep ascending slot order.
            ids = torch.sort(-score, stable=True).indices[:k]
            with torch.no_grad():
                layer.write_mask[ids.to(layer.write_mask.device)] = False
            owner[ids] = ctx.experience
        self.history.append(record)

    # --- report -------------------------------------------------------------------------------
    def owned(self) -> dict[str, dict[str, int]]:
        """{layer: {domain: frozen slots owned}}; a domain seen twice sums its experiences."""
        domains = {h["experience"]: h["domain"] for h in self.history}
        out: dict[str, dict[str, int]] = {}
        for name, owner in self.owner.items():
            out[name] = {}
            for exp, domain in domains.items():
                out[name][domain] = out[name].get(domain, 0) + int((owner == exp).sum())
        return out

    def summary(self) -> dict[str, Any]:
        return {"owned_slots": self.owned()}

    # --- resume -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"history": [{**h, "counts": {k: v.clone() for k, v in h["counts"].items()}} for h in self.history],
                "owner": {k: v.clone() for k, v in self.owner.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"history", "owner"}:
            raise ValueError(f"slot_freezing: state has keys {sorted(state)}, expected ['history', 'owner']")
        self.history = [{**h, "counts": {k: v.clone() for k, v in h["counts"].items()}} for h in state["history"]]
        self.owner = {k: v.clone() for k, v in state["owner"].items()}
