"""The one hook protocol every continual-learning strategy implements (docs/architecture.md, contract 3).

The LightningModule owns the training loop and calls these hooks; a strategy never runs a loop
of its own. Order of calls within one experience t:

    on_experience_start(ctx)                         # again on resume mid-experience (ctx.resumed)
    for each training batch:
        batch = transform_batch(batch, ctx)          # replay mixes in stored data
        outputs = model(batch)                       # fast-weight writes happen inside forward
        after_write(ctx)                             # e.g. undo writes to frozen slots
        losses = {"lm": lm_loss, **extra_losses(batch, outputs, ctx)}
        backward(sum(losses.values()))               # each term logged under its own name
        after_backward(ctx)                          # e.g. mask gradients
    on_experience_end(ctx)                           # e.g. consolidate, store replay data

and, in every evaluation, `eval_memory(domain)` before each domain is read: the memory that
domain reads (None, the default: the model's own; per-domain experts route each domain to its own).

Extra loss terms are *returned*, never added to a shared loss object, so the module can log each
one and a composite of strategies cannot silently overwrite another's term. `after_backward` and
`extra_losses` only run on batches that take an outer-optimiser step (none in 'fast' mode, where
slow weights are frozen). Strategies reach the memory through the model's public slot knobs
(write mask, read counts, slot reset), never through layer internals.
"""

from dataclasses import dataclass
from typing import Any, get_args

from torch import Tensor, nn

from cl_platform.results import Mode

# Whatever the training DataLoader yields; `transform_batch` must return the same structure.
Batch = Any


@dataclass
class StrategyContext:
    """What a hook may look at. Built by the runner for each experience; the LightningModule keeps
    `global_step` current.

    model:        the network; its FwPKM layers expose the public slot knobs
    experience:   1-based index t of the current experience (results row t after it ends)
    domain:       the domain experience t trains
    global_step:  training batches so far over the whole run (the run's own step: equal to the
                  optimiser steps in 'finetune'; in 'fast' there is no optimiser, and Lightning's
                  `global_step` would stay 0)
    mode:         'fast' (slow weights frozen, fast weights adapt) or 'finetune'
    current:      the stream's experience t (`stream[t - 1]`): `.domain`, `.data.segments` (its
                  adapt segments), `.adapt_loader(batch_size)`; None where no runner built one
    stream:       the whole stream (`len(stream)`, `stream[i]`: every experience, for replay)
    num_experiences: experiences in the stream (0 where unknown)
    eval_domains: the domains every results row evaluates, in matrix order
    resumed:      True when `on_experience_start` runs again for an experience a resumed run
                  continues in its middle (see `Strategy.on_experience_start`)
    The runner fills every field; a strategy that needs `current` or `stream` refuses a context
    without it by name (`require`), instead of failing on an attribute of None.
    """

    model: nn.Module
    experience: int
    domain: str
    global_step: int = 0
    mode: Mode = "fast"
    current: Any = None
    stream: Any = None
    num_experiences: int = 0
    eval_domains: tuple[str, ...] = ()
    resumed: bool = False

    def require(self, name: str, who: str) -> Any:
        """Field `name` (current, stream), which strategy `who` needs: an error naming both if unset."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{who}: the strategy context of experience {self.experience} has no {name!r} "
                             f"(it needs a runner that streams the experience's data)")
        return value

    def __post_init__(self) -> None:
        if self.experience < 1:
            raise ValueError(f"StrategyContext.experience must be >= 1, got {self.experience}")
        if self.mode not in get_args(Mode):
            raise ValueError(
                f"StrategyContext.mode is {self.mode!r}, expected one of {get_args(Mode)}"
            )


class Strategy:
    """Base class: every hook is a no-op, so a strategy overrides only what it changes.

    A strategy with state (replay buffer, Fisher information, a teacher snapshot) overrides
    `state_dict` / `load_state_dict` so that a resumed run continues exactly.
    """

    # True where `eval_memory` may return a memory: the run refuses it under the `reset` eval
    # policy (whose control is the re-drawn table a routed memory would replace).
    routes_eval_memory: bool = False

    def check(self, model_config: Any, mode: Mode, stream: Any = None) -> None:
        """Refuse, with a ValueError saying why, a model (its `ModelConfig`), a mode or a stream
        (a sequence of experiences; None when not at hand) this strategy cannot work with. The
        runner's setup calls it before any pretraining, so bad input fails at config time."""

    def on_experience_start(self, ctx: StrategyContext) -> None:
        """Before the first training batch of experience `ctx.experience`.

        On resume in the middle of experience t it runs again for t (`ctx.resumed` True), on the
        model as the checkpoint holds it; then the checkpoint's model and strategy state are loaded
        over whatever it changed. So set up here what no checkpoint holds (write rules, writes on or
        off, attributes derived from `ctx`), and keep in `state_dict` what it computes from the
        model as the experience found it (a snapshot of the memory, a teacher): at resume the model
        is mid-experience."""

    def on_experience_end(self, ctx: StrategyContext) -> None:
        """After the last training batch of the experience, before it is evaluated."""

    def transform_batch(self, batch: Batch, ctx: StrategyContext) -> Batch:
        """Return the batch to train on (training batches only; evaluation is never changed)."""
        return batch

    def extra_losses(self, batch: Batch, outputs: Any, ctx: StrategyContext) -> dict[str, Tensor]:
        """Scalar loss terms to add to the LM loss, keyed by a name unique across strategies.

        Names are logged as given, so prefix them with the strategy (e.g. "ewc/penalty").
        """
        return {}

    def after_write(self, ctx: StrategyContext) -> None:
        """After the forward pass has applied this batch's fast-weight writes."""

    def after_backward(self, ctx: StrategyContext) -> None:
        """After gradients are computed, before the optimiser step."""

    def eval_memory(self, domain: str) -> Any:
        """The memory (a `model.snapshot_memory()` list) evaluation reads for `domain`, or None
        for the model's own. Evaluation restores the model's memory afterwards whatever it reads."""
        return None

    def summary(self) -> dict[str, Any]:
        """What the strategy did, JSON-serialisable (e.g. frozen slots owned per domain); the
        runner writes it to the run folder's `strategy.json` after every experience."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume; must be savable with `torch.save`."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A stateless strategy handed state means a checkpoint from another strategy; loading it
        # silently would resume a different experiment.
        if state:
            raise ValueError(
                f"{type(self).__name__} keeps no state but was given keys {sorted(state)}"
            )


class CompositeStrategy(Strategy):
    """Runs several strategies in the given order, as one.

    Batches pass through each `transform_batch` in turn; loss dicts are merged and a name
    returned by two strategies is an error (one term would silently replace the other).
    """

    def __init__(self, strategies: list[Strategy]):
        self.strategies = list(strategies)
        routers = [type(s).__name__ for s in self.strategies if s.routes_eval_memory]
        if len(routers) > 1:
            raise ValueError(f"strategies {routers} each choose the memory evaluation reads; compose at most one")
        self.routes_eval_memory = bool(routers)

    def check(self, model_config: Any, mode: Mode, stream: Any = None) -> None:
        for strategy in self.strategies:
            strategy.check(model_config, mode, stream)

    def on_experience_start(self, ctx: StrategyContext) -> None:
        for strategy in self.strategies:
            strategy.on_experience_start(ctx)

    def on_experience_end(self, ctx: StrategyContext) -> None:
        for strategy in self.strategies:
            strategy.on_experience_end(ctx)

    def transform_batch(self, batch: Batch, ctx: StrategyContext) -> Batch:
        for strategy in self.strategies:
            batch = strategy.transform_batch(batch, ctx)
        return batch

    def extra_losses(self, batch: Batch, outputs: Any, ctx: StrategyContext) -> dict[str, Tensor]:
        merged: dict[str, Tensor] = {}
        owner: dict[str, str] = {}
        for i, strategy in enumerate(self.strategies):
            who = f"{type(strategy).__name__} (#{i})"
            for name, loss in strategy.extra_losses(batch, outputs, ctx).items():
                if name in merged:
                    raise ValueError(f"loss name {name!r} returned by both {owner[name]} and {who}")
                merged[name] = loss
                owner[name] = who
        return merged

    def after_write(self, ctx: StrategyContext) -> None:
        for strategy in self.strategies:
            strategy.after_write(ctx)

    def after_backward(self, ctx: StrategyContext) -> None:
        for strategy in self.strategies:
            strategy.after_backward(ctx)

    def eval_memory(self, domain: str) -> Any:
        for strategy in self.strategies:  # at most one routes (refused at construction otherwise)
            if strategy.routes_eval_memory:
                return strategy.eval_memory(domain)
        return None

    def summary(self) -> dict[str, Any]:
        return {type(s).__name__ + f"#{i}": s.summary() for i, s in enumerate(self.strategies)}

    def state_dict(self) -> dict[str, Any]:
        # The class name travels with each state so that a checkpoint from a differently
        # composed run is refused instead of loaded into the wrong strategy.
        return {
            "strategies": [
                {"class": type(strategy).__name__, "state": strategy.state_dict()}
                for strategy in self.strategies
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        entries = state.get("strategies")
        if not isinstance(entries, list) or len(entries) != len(self.strategies):
            found = len(entries) if isinstance(entries, list) else "no"
            raise ValueError(
                f"CompositeStrategy of {len(self.strategies)} strategies given state for {found}"
            )
        for i, (strategy, entry) in enumerate(zip(self.strategies, entries)):
            expected = type(strategy).__name__
            if entry.get("class") != expected:
                raise ValueError(
                    f"CompositeStrategy state #{i} is for {entry.get('class')!r}, "
                    f"expected {expected!r}"
                )
            strategy.load_state_dict(entry["state"])
