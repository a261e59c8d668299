"""Continual-learning strategies, one file each, against the hooks in `cl_platform.strategy`.

A new strategy is added to `STRATEGIES` by hand: the registry is the list of what exists, and a
test checks that every `Strategy` subclass in this package is in it.
"""

from typing import Any

from cl_platform.strategy import Strategy
from strategies.distill import Distill
from strategies.ewc import EWC
from strategies.experts import Experts
from strategies.generative_replay import GenerativeReplay
from strategies.lora import LoRA
from strategies.lwf import LwF
from strategies.naive import NaiveStrategy
from strategies.replay import Replay
from strategies.slot_freezing import SlotFreezing
from strategies.slot_transfer import SlotTransfer
from strategies.sparse_memory import SparseMemory

STRATEGIES: dict[str, type[Strategy]] = {
    "naive": NaiveStrategy,
    "distill": Distill,
    "ewc": EWC,
    "experts": Experts,
    "generative_replay": GenerativeReplay,
    "lora": LoRA,
    "lwf": LwF,
    "replay": Replay,
    "slot_freezing": SlotFreezing,
    "slot_transfer": SlotTransfer,
    "sparse_memory": SparseMemory,
}


def get_strategy(name: str, **kwargs: Any) -> Strategy:
    """Build the strategy registered as `name` with `kwargs` passed to its constructor."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        allowed = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown strategy {name!r}; allowed: {allowed}") from None
    return cls(**kwargs)
