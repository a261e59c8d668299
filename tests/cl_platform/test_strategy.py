import importlib
import inspect
import pkgutil

import pytest
import torch
from torch import nn

import strategies
from cl_platform.strategy import CompositeStrategy, Strategy, StrategyContext
from strategies import STRATEGIES, get_strategy
from strategies.naive import NaiveStrategy


@pytest.fixture
def ctx() -> StrategyContext:
    return StrategyContext(model=nn.Linear(2, 2), experience=1, domain="math", global_step=0)


class Recorder(Strategy):
    """Logs every hook call into a shared list, tags batches, returns one named loss."""

    def __init__(self, tag: str, log: list[str], loss_name: str | None = None):
        self.tag, self.log, self.loss_name = tag, log, loss_name
        self.calls = 0

    def on_experience_start(self, ctx):
        self.log.append(f"{self.tag}.start")

    def on_experience_end(self, ctx):
        self.log.append(f"{self.tag}.end")

    def transform_batch(self, batch, ctx):
        return [*batch, self.tag]

    def extra_losses(self, batch, outputs, ctx):
        return {self.loss_name: torch.tensor(1.0)} if self.loss_name else {}

    def after_write(self, ctx):
        self.log.append(f"{self.tag}.write")

    def after_backward(self, ctx):
        self.calls += 1
        self.log.append(f"{self.tag}.backward")

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_base_hooks_are_no_ops(ctx):
    s = Strategy()
    batch = {"input_ids": torch.zeros(2, 3)}
    s.on_experience_start(ctx)
    assert s.transform_batch(batch, ctx) is batch
    assert s.extra_losses(batch, None, ctx) == {}
    s.after_write(ctx)
    s.after_backward(ctx)
    s.on_experience_end(ctx)
    assert s.state_dict() == {}
    s.load_state_dict({})


def test_stateless_strategy_refuses_foreign_state():
    with pytest.raises(ValueError, match=r"NaiveStrategy keeps no state.*buffer"):
        NaiveStrategy().load_state_dict({"buffer": []})


def test_context_validation():
    with pytest.raises(ValueError, match="experience"):
        StrategyContext(model=nn.Identity(), experience=0, domain="math")
    with pytest.raises(ValueError, match="mode"):
        StrategyContext(model=nn.Identity(), experience=1, domain="math", mode="slow")


def test_composite_runs_in_order_and_merges_losses(ctx):
    log: list[str] = []
    composite = CompositeStrategy(
        [Recorder("a", log, "a/loss"), Recorder("b", log), Recorder("c", log, "c/loss")]
    )
    composite.on_experience_start(ctx)
    assert composite.transform_batch(["x"], ctx) == ["x", "a", "b", "c"]
    composite.after_write(ctx)
    assert set(composite.extra_losses(None, None, ctx)) == {"a/loss", "c/loss"}
    composite.after_backward(ctx)
    composite.on_experience_end(ctx)
    assert log == [
        f"{tag}.{hook}" for hook in ("start", "write", "backward", "end") for tag in "abc"
    ]


def test_composite_rejects_duplicate_loss_names(ctx):
    composite = CompositeStrategy([Recorder("a", [], "penalty"), Recorder("b", [], "penalty")])
    with pytest.raises(ValueError, match=r"'penalty'.*Recorder \(#0\).*Recorder \(#1\)"):
        composite.extra_losses(None, None, ctx)


def test_composite_state_round_trip(ctx):
    first = CompositeStrategy([Recorder("a", []), NaiveStrategy()])
    first.after_backward(ctx)
    first.after_backward(ctx)
    resumed = CompositeStrategy([Recorder("a", []), NaiveStrategy()])
    resumed.load_state_dict(first.state_dict())
    assert resumed.strategies[0].calls == 2

    with pytest.raises(ValueError, match="is for 'Recorder', expected 'NaiveStrategy'"):
        CompositeStrategy([NaiveStrategy(), Recorder("a", [])]).load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match="3 strategies given state for 2"):
        CompositeStrategy([Recorder("a", []), NaiveStrategy(), NaiveStrategy()]).load_state_dict(
            first.state_dict()
        )


def test_get_strategy():
    assert isinstance(get_strategy("naive"), NaiveStrategy)
    with pytest.raises(ValueError, match=r"unknown strategy 'ewc2'; allowed: .*naive"):
        get_strategy("ewc2")


def test_every_strategy_subclass_is_registered():
    registered = set(STRATEGIES.values())
    defined = set()
    for info in pkgutil.iter_modules(strategies.__path__, prefix="strategies."):
        module = importlib.import_module(info.name)
        defined |= {
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Strategy) and cls.__module__ == module.__name__
        }
    assert NaiveStrategy in defined
    assert defined - registered == set(), "add these to strategies.STRATEGIES"
    assert all(issubclass(cls, Strategy) for cls in registered)
