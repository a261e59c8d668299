"""Strategies composed as a list in the run config: `strategy: [{name, kwargs}, ...]` builds one
CompositeStrategy of the members in order, named by the members' names joined with '+'; every bad
element is refused before any work with its 0-based path (`strategy[1].name`); the mapping form
serialises (and so hashes into the run identity) exactly as before lists existed."""
import dataclasses
import json

import pytest
import torch

from cl_platform.check import ConfigError
from cl_platform.config import RunConfig, StrategyConfig, config_hash, load_config, to_yaml
from cl_platform.strategy import CompositeStrategy
from experiments.setup import Setup, make_strategy
from strategies import STRATEGIES
from strategies.replay import Replay
from strategies.slot_freezing import SlotFreezing

COMPOSED = """
strategy:
  - {name: replay, kwargs: {size: 64, policy: balanced, ratio: 0.25}}
  - {name: slot_freezing, kwargs: {fraction: 0.05}}
"""


def write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def strategy_of(tmp_path, text: str, overrides=()):
    """The strategy object a run of this config would use (the stream is not needed to build it)."""
    path = write(tmp_path, text)
    cfg = load_config(path, overrides)
    return make_strategy(Setup(config=cfg, config_path=path, scenario=None, model_config=cfg.model))


def test_a_list_builds_a_composite_of_the_members_in_order(tmp_path):
    cfg = load_config(write(tmp_path, COMPOSED))
    assert cfg.strategy == [StrategyConfig("replay", {"size": 64, "policy": "balanced", "ratio": 0.25}),
                            StrategyConfig("slot_freezing", {"fraction": 0.05})]
    assert cfg.strategy_name == "replay+slot_freezing"
    strategy = strategy_of(tmp_path, COMPOSED)
    assert isinstance(strategy, CompositeStrategy)
    replay, freezing = strategy.strategies
    assert type(replay) is Replay and (replay.size, replay.policy, replay.ratio) == (64, "balanced", 0.25)
    assert type(freezing) is SlotFreezing and freezing.fraction == 0.05 and freezing.budget == 0.25  # default


def test_the_same_strategy_twice_is_two_instances(tmp_path):
    strategy = strategy_of(tmp_path, "strategy: [{name: naive}, {name: naive}]")
    assert isinstance(strategy, CompositeStrategy) and len(strategy.strategies) == 2
    assert strategy.strategies[0] is not strategy.strategies[1]


def test_a_list_of_one_is_that_strategy_with_the_same_identity(tmp_path):
    one = load_config(write(tmp_path, "strategy: [{name: replay, kwargs: {size: 8}}]"))
    mapping = load_config(write(tmp_path, "strategy: {name: replay, kwargs: {size: 8}}"))
    assert one == mapping and one.to_dict() == mapping.to_dict() and one.strategy_name == "replay"
    assert type(strategy_of(tmp_path, "strategy: [{name: replay, kwargs: {size: 8}}]")) is Replay


def test_the_resolved_list_loads_back_to_the_same_tree(tmp_path):
    cfg = load_config(write(tmp_path, COMPOSED))
    back = tmp_path / "back.yaml"
    back.write_text(to_yaml(cfg))
    assert load_config(back) == cfg
    assert cfg.to_dict()["strategy"] == [{"name": "replay", "kwargs": {"size": 64, "policy": "balanced", "ratio": 0.25}},
                                         {"name": "slot_freezing", "kwargs": {"fraction": 0.05}}]
    mapping = load_config(write(tmp_path, "strategy: {name: replay, kwargs: {size: 64, policy: balanced, ratio: 0.25}}"))
    assert config_hash(mapping.to_dict()) != config_hash(cfg.to_dict())


def test_the_mapping_form_serialises_as_before_lists_existed(tmp_path):
    """The run identity's config part is `RunConfig.to_dict()` (experiments/setup.py run_identity),
    and the run folder's config.yaml is `to_yaml`: for the mapping form both must be exactly the
    two-key `{name, kwargs}` mapping they always were, with nothing added anywhere in the tree."""
    cfg = load_config(write(tmp_path, "strategy: {name: replay, kwargs: {size: 64}}"), ["strategy.kwargs.ratio=0.5"])
    data = cfg.to_dict()
    assert list(data) == [f.name for f in dataclasses.fields(RunConfig)]
    assert data["strategy"] == {"name": "replay", "kwargs": {"size": 64, "ratio": 0.5}}
    assert json.dumps(data["strategy"], sort_keys=True) == '{"kwargs": {"ratio": 0.5, "size": 64}, "name": "replay"}'
    assert "\nstrategy:\n  name: replay\n  kwargs:\n    size: 64\n    ratio: 0.5\nseed: 0\n" in to_yaml(cfg)
    default = load_config(write(tmp_path, ""))
    assert default.to_dict()["strategy"] == {"name": "naive", "kwargs": {}} and default.strategy_name == "naive"
    # The typed tree of the defaults is unchanged: what Python construction gives.
    assert default == RunConfig(stream=default.stream)


def test_dotted_overrides_reach_the_mapping_form_and_a_list_is_overridden_whole(tmp_path):
    cfg = load_config(write(tmp_path, "strategy: {name: replay}"), ["strategy.name=ewc", "strategy.kwargs={lam: 2.0}"])
    assert cfg.strategy == [StrategyConfig("ewc", {"lam": 2.0})]
    cfg = load_config(write(tmp_path, "strategy: {name: replay}"), ["strategy=[{name: replay}, {name: naive}]"])
    assert cfg.strategy_name == "replay+naive"
    cfg = load_config(write(tmp_path, COMPOSED), ["strategy=[{name: ewc}, {name: naive, kwargs: {}}]"])
    assert cfg.strategy == [StrategyConfig("ewc"), StrategyConfig("naive")]
    for override in ("strategy.name=ewc", "strategy={name: ewc}"):
        with pytest.raises(ConfigError, match=r"^command line: .*'strategy'.*list.*override it whole"):
            load_config(write(tmp_path, COMPOSED), [override])


@pytest.mark.parametrize(
    "yaml_text, overrides, field, words",
    [
        ("strategy: []", [], "strategy", ["non-empty list"]),
        ("", ["strategy=[]"], "strategy", ["non-empty list"]),
        ("strategy: [{name: replay}, 3]", [], "strategy[1]", ["3", "must be a mapping"]),
        ("strategy: [{name: replay}, [naive]]", [], "strategy[1]", ["must be a mapping"]),
        ("strategy: [{name: replay}, {nme: naive}]", [], "strategy[1].nme", ["unknown field", "did you mean 'name'"]),
        ("", ["strategy=[{name: replay}, {name: naive, kwarg: {}}]"], "strategy[1].kwarg", ["did you mean 'kwargs'"]),
        ("strategy: [{name: replay}, {name: naive, kwargs: 3}]", [], "strategy[1].kwargs", []),
        ("strategy: [{name: replay}, {name: ''}]", [], "strategy[1].name", ["non-empty string"]),
    ],
)
def test_bad_elements_are_named_by_their_path_when_loading(tmp_path, yaml_text, overrides, field, words):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, yaml_text), overrides)
    message = str(info.value)
    assert f"'{field}'" in message and all(w in message for w in words), message
    assert info.value.field == field
    assert message.startswith("command line:" if overrides else str(tmp_path / "run.yaml")), message


@pytest.mark.parametrize(
    "yaml_text, field, words",
    [
        ("strategy: [{name: replay}, {name: slot_freezng}]", "strategy[1].name", ["'slot_freezng'", *STRATEGIES]),
        ("strategy: [{name: replay}, {name: naive, kwargs: {alpha: 1}}]", "strategy[1].kwargs", ["alpha"]),
        ("strategy: [{name: replay, kwargs: {policy: fifo}}, {name: naive}]", "strategy[0].kwargs", ["fifo"]),
        ("strategy: {name: ewcc}", "strategy.name", ["'ewcc'", *STRATEGIES]),  # the mapping form as before
        ("strategy: {name: replay, kwargs: {ratio: 5}}", "strategy.kwargs", ["ratio"]),
    ],
)
def test_bad_names_and_arguments_are_named_by_their_element_before_any_work(tmp_path, yaml_text, field, words):
    with pytest.raises(ConfigError) as info:
        strategy_of(tmp_path, yaml_text)
    message = str(info.value)
    assert f"run config field '{field}'" in message and all(w in message for w in words), message


def test_python_construction_checks_the_list():
    with pytest.raises(ConfigError, match="strategy"):
        RunConfig(strategy=[])
    with pytest.raises(ConfigError, match="strategy"):
        RunConfig(strategy=[{"name": "naive"}])
    cfg = RunConfig(strategy=[StrategyConfig("replay"), StrategyConfig("naive")])
    assert cfg.strategy_name == "replay+naive" and cfg.strategy_fields[1] == ("strategy[1]", StrategyConfig("naive"))
    # The single form is a list of one, named `strategy` in errors and hparams, saved as the mapping.
    one, listed = RunConfig(strategy=StrategyConfig("ewc")), RunConfig(strategy=[StrategyConfig("ewc")])
    assert one == listed and one.strategy == [StrategyConfig("ewc")] and one.strategy_fields == [("strategy", StrategyConfig("ewc"))]
    assert one.to_dict()["strategy"] == {"name": "ewc", "kwargs": {}}
    assert cfg.to_dict()["strategy"] == [{"name": "replay", "kwargs": {}}, {"name": "naive", "kwargs": {}}]


@pytest.mark.slow
def test_a_composed_run_through_the_engine_has_both_members_act(tiny, tmp_path):
    """replay + slot_freezing on the tiny stream (fast mode): results and strategy.json carry the
    joined name, slot freezing owns slots per domain, and replay's buffer holds segments."""
    strategy = [{"name": "replay", "kwargs": {"size": 6, "policy": "reservoir", "ratio": 0.5}},
                {"name": "slot_freezing", "kwargs": {"fraction": 0.1, "budget": 0.3}}]
    config = tiny.config(tmp_path / "composed.yaml", name="composed", strategy=strategy)
    out = tiny.run_cli(["run", str(config)]).stdout
    assert "replay+slot_freezing" in out
    folder = next(tiny.runs.glob("composed-*"))
    results = json.loads((folder / "results.json").read_text())
    assert results["strategy"] == "replay+slot_freezing"
    summary = json.loads((folder / "strategy.json").read_text())
    assert summary["name"] == "replay+slot_freezing" and summary["after_experience"] == 2
    assert set(summary) == {"name", "after_experience", "Replay#0", "SlotFreezing#1"}
    assert summary["SlotFreezing#1"]["owned_slots"] == {"fwpkm1": {"math": 25, "code": 25}}  # 10 % of 256 each
    state = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["strategy"]
    assert [m["class"] for m in state["strategies"]] == ["Replay", "SlotFreezing"]
    groups = state["strategies"][0]["state"]["storage"]["groups"]
    assert sum(len(g["ids"]) for g in groups.values()) == 6  # the reservoir is full
