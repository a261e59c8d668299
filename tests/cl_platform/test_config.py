"""The configuration tree: one loader, typed dotted overrides, errors that name the key, defaults
that follow the tree (cl.fwpkm from pretrain.fwpkm), and a resolved form that loads back equal."""
import dataclasses

import pytest

from cl_platform.check import ConfigError
from cl_platform.config import CLConfig, RunConfig, config_hash, dict_diff, load_config, to_yaml
from cl_platform.memory.fwpkm import WriteRule


def write(tmp_path, text: str, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults_are_valid_and_resolve_the_small_model(tmp_path):
    cfg = load_config(write(tmp_path, ""))
    assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.window, cfg.model.vocab_size) == (4, 256, 128, None)
    assert cfg.cl.mode == "fast" and cfg.cl.eval_memory == "frozen"
    assert cfg.cl.fwpkm == cfg.pretrain.fwpkm == WriteRule()
    assert cfg == RunConfig(stream=cfg.stream)


@pytest.mark.parametrize(
    "yaml_text, overrides, field",
    [
        ("cl: {mode: fastt}", [], "cl.mode"),
        ("", ["cl.mode=fastt"], "cl.mode"),
        ("", ["cl.eval_memory=keep"], "cl.eval_memory"),
        ("", ["cl.batch_size=0"], "cl.batch_size"),
        ("", ["cl.devices=2"], "cl.devices"),  # DDP only makes sense with slow weights to train
        ("", ["pretrain.lr=-1"], "pretrain.lr"),
        ("", ["pretrain.min_lr_ratio=2"], "pretrain.min_lr_ratio"),
        ("", ["pretrain.fwpkm.lr_values=-0.5"], "pretrain.fwpkm.lr_values"),
        ("", ["cl.fwpkm.chunk=1"], "cl.fwpkm.chunk"),
        ("", ["cl.precision=fp16"], "cl.precision"),
        ("pretrain: {precision: bf16}", [], "pretrain.precision"),
        ("", ["model.fwpkm.topk=0"], "model.fwpkm.topk"),
        ("", ["model.fwpkm_layers=[1,9]"], "model.fwpkm_layers"),
        ("", ["model.vocab_size=100"], "model"),
        ("", ["seed=zero"], "seed"),
        ("order: math", [], "order"),
        ("", ["cl.fwpkm_by_layer.fwpkm2.lr_values=0.5"], "cl.fwpkm_by_layer.fwpkm2"),  # layers are 1 and 3
    ],
)
def test_bad_values_are_named_by_their_dotted_path(tmp_path, yaml_text, overrides, field):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, yaml_text), overrides)
    assert f"'{field}'" in str(info.value), str(info.value)
    # The message says where the value came from: the command line or the file.
    assert str(info.value).startswith("command line:" if overrides else str(tmp_path / "run.yaml"))


@pytest.mark.parametrize(
    "override, key, suggestion",
    [
        ("cl.mdoe=fast", "cl.mdoe", "mode"),
        ("cl.fwpkm.lr_value=0.3", "cl.fwpkm.lr_value", "lr_values"),
        ("strategyy.name=naive", "strategyy", "strategy"),
        ("model.n_layers=2", "model.n_layers", "n_layer"),
    ],
)
def test_an_unknown_key_is_named_with_the_nearest_valid_keys(tmp_path, override, key, suggestion):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ""), [override])
    message = str(info.value)
    assert f"unknown field '{key}'" in message and f"did you mean '{suggestion}'" in message, message


def test_an_override_without_a_value_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(write(tmp_path, ""), ["seed"])


def test_unknown_preset_names_the_presets(tmp_path):
    with pytest.raises(ConfigError, match=r"'model.preset': 'huge' is not one of \['paper', 'paper_pkm', 'small'\]"):
        load_config(write(tmp_path, "model: {preset: huge}"))


def test_presets_give_the_defaults_and_fields_override_them(tmp_path):
    cfg = load_config(write(tmp_path, "model: {preset: paper, n_layer: 6}"), ["model.fwpkm_layers=[1,3]"])
    assert (cfg.model.preset, cfg.model.n_layer, cfg.model.d_model, cfg.model.window) == ("paper", 6, 768, 512)
    assert cfg.model.fwpkm_layers == [1, 3] and cfg.model.fwpkm.num_subkeys == 512


def test_overrides_of_nested_list_and_boolean_fields(tmp_path):
    cfg = load_config(write(tmp_path, "cl: {mode: finetune, lr: 0.001}"), [
        "cl.fwpkm.lr_values=0.3", "cl.fwpkm.lookahead=false", "order=[math,law,math]",
        "model.fwpkm_layers=[3]", "seed=1", "strategy.kwargs.alpha=0.5",
    ])
    assert cfg.cl.fwpkm.lr_values == 0.3 and cfg.cl.fwpkm.lookahead is False
    assert cfg.order == ["math", "law", "math"] and cfg.model.fwpkm_layers == [3] and cfg.seed == 1
    assert cfg.strategy[0].kwargs == {"alpha": 0.5} and cfg.cl.lr == 0.001  # the file's value stays
    with pytest.raises(ConfigError, match=r"'cl.fwpkm.lookahead'.*not a valid bool"):
        load_config(write(tmp_path, ""), ["cl.fwpkm.lookahead=maybe"])
    with pytest.raises(ConfigError, match=r"'cl.fwpkm.chunk'.*could not be converted to Integer"):
        load_config(write(tmp_path, ""), ["cl.fwpkm.chunk=1.5"])


@pytest.mark.parametrize("override, field, value, fix", [
    ("order=math,law", "order", "'math,law'", "order=[math,law]"),
    ("model.fwpkm_layers=1,3", "model.fwpkm_layers", "'1,3'", "model.fwpkm_layers=[1,3]"),
    ("model.pkm_layers=2", "model.pkm_layers", "2", "model.pkm_layers=[2]"),
])
def test_a_list_field_given_without_brackets_is_answered_with_the_bracketed_form(tmp_path, override, field, value,
                                                                                  fix):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, ""), [override])
    assert str(info.value) == (f"command line: run config field '{field}': expects a list, got {value}; write a list "
                               f"in brackets: {fix} on the command line, {fix.split('=')[1]} in a YAML file")
    assert info.value.field == field
    # The bracketed form is the one that loads.
    assert load_config(write(tmp_path, ""), [fix]) is not None


def test_the_continual_write_rule_defaults_to_the_pretraining_one_field_by_field(tmp_path):
    text = "pretrain: {fwpkm: {lr_values: 0.5, chunk: 64}}\ncl: {fwpkm: {lr_keys: 0.1}}\n"
    cfg = load_config(write(tmp_path, text), ["cl.fwpkm_by_layer.fwpkm3.lr_values=0.2"])
    assert cfg.pretrain.fwpkm == WriteRule(lr_values=0.5, chunk=64)
    assert cfg.cl.fwpkm == WriteRule(lr_values=0.5, chunk=64, lr_keys=0.1)
    assert cfg.cl.fwpkm_by_layer == {"fwpkm3": WriteRule(lr_values=0.2, chunk=64, lr_keys=0.1)}
    assert cfg.cl.write_rules(["fwpkm1", "fwpkm3"]) == {"fwpkm1": cfg.cl.fwpkm, "fwpkm3": cfg.cl.fwpkm_by_layer["fwpkm3"]}
    # The write chunk is not the attention window: changing one leaves the other.
    assert cfg.model.window == 128


def test_finetune_only_fields_are_refused_in_fast_mode(tmp_path):
    with pytest.raises(ConfigError, match=r"'cl.lr': 0.001 is used in finetune mode only"):
        load_config(write(tmp_path, ""), ["cl.lr=0.001"])
    assert load_config(write(tmp_path, ""), ["cl.mode=finetune", "cl.lr=0.001"]).cl.lr == 0.001


def test_the_resolved_yaml_loads_back_to_the_same_tree(tmp_path):
    cfg = load_config(write(tmp_path, "pretrain: {fwpkm: {chunk: 64}}"), [
        "cl.fwpkm.lr_values=0.3", "cl.fwpkm_by_layer.fwpkm1.lookahead=false", "order=[code,web]", "name=x"])
    again = load_config(write(tmp_path, to_yaml(cfg), "resolved.yaml"))
    assert again == cfg


def test_paths_in_the_file_resolve_against_its_folder_and_on_the_command_line_against_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub", "stream: ../streams/s.yaml\ncl: {mode: finetune}\n")
    cfg = load_config(path)
    assert cfg.stream == str((tmp_path / "streams" / "s.yaml").resolve())
    monkeypatch.chdir(tmp_path)
    assert load_config(path, ["stream=other.yaml"]).stream == str((tmp_path / "other.yaml").resolve())


def test_bad_yaml_file_is_named(tmp_path):
    path = write(tmp_path, "cl: {mode: [unclosed\n")
    with pytest.raises(ConfigError, match="run.yaml"):
        load_config(path)
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path, "- a list"))
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")


def test_python_construction_runs_the_same_checks():
    with pytest.raises(ConfigError, match=r"CLConfig.mode='fastt': is not one of"):
        CLConfig(mode="fastt")
    with pytest.raises(ConfigError, match=r"WriteRule.chunk"):
        WriteRule(chunk=0)


def test_config_hash_is_canonical_and_sensitive():
    a = {"cl": dataclasses.asdict(CLConfig()), "seed": 0}
    b = {"seed": 0, "cl": dataclasses.asdict(CLConfig())}
    assert config_hash(a) == config_hash(b)
    c = {"seed": 0, "cl": dataclasses.asdict(CLConfig(mode="finetune"))}
    assert config_hash(a) != config_hash(c)
    assert dict_diff(a, c) == ["cl.mode: was 'fast', now 'finetune'"]
