import dataclasses

import pytest

from cl_platform.run_config import CLConfig, ConfigError, RunConfig, config_hash, dict_diff, load_run_config


def test_defaults_are_valid_and_resolve_the_small_model():
    cfg = RunConfig()
    model = cfg.model_config(vocab_size=4096)
    assert (model.n_layer, model.d_model, model.vocab_size) == (4, 256, 4096)
    assert cfg.cl.mode == "fast" and cfg.cl.eval_memory == "frozen"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"cl": {"mode": "fastt"}}, "cl.mode"),
        ({"cl": {"eval_memory": "keep"}}, "cl.eval_memory"),
        ({"cl": {"batch_size": 0}}, "cl.batch_size"),
        ({"cl": {"devices": 2}}, "cl.devices"),  # DDP only makes sense with slow weights to train
        ({"pretrain": {"lr": -1}}, "pretrain.lr"),
        ({"pretrain": {"min_lr_ratio": 2}}, "pretrain.min_lr_ratio"),
        ({"cl": {"mdoe": "fast"}}, "cl.mdoe"),
        ({"strategyy": {}}, "strategyy"),
        ({"order": "math,law"}, "order"),
        ({"model": {"n_layers": 2}}, "model"),
        ({"model": {"vocab_size": 100}}, "model.vocab_size"),
        ({"seed": "zero"}, "seed"),
    ],
)
def test_bad_fields_are_named(data, field):
    with pytest.raises(ConfigError, match=rf"'?{field}"):
        RunConfig.from_dict(data)


def test_model_override_errors_name_the_model_field():
    with pytest.raises(ConfigError, match="n_layers"):
        RunConfig.from_dict({"model": {"preset": "small", "n_layers": 2}})
    with pytest.raises(ConfigError, match="preset"):
        RunConfig.from_dict({"model": {"preset": "huge"}})


def test_yaml_paths_resolve_against_the_config_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "run.yaml"
    path.write_text("stream: ../streams/s.yaml\ncl: {mode: finetune}\n")
    cfg, where = load_run_config(path)
    assert cfg.stream == str((tmp_path / "streams" / "s.yaml").resolve())
    assert cfg.cl.mode == "finetune" and where == path


def test_bad_yaml_file_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("cl: {mode: [unclosed\n")
    with pytest.raises(ConfigError, match="run.yaml"):
        load_run_config(path)
    with pytest.raises(FileNotFoundError):
        load_run_config(tmp_path / "missing.yaml")


def test_config_hash_is_canonical_and_sensitive():
    a = {"cl": dataclasses.asdict(CLConfig()), "seed": 0}
    b = {"seed": 0, "cl": dataclasses.asdict(CLConfig())}
    assert config_hash(a) == config_hash(b)
    c = {"seed": 0, "cl": dataclasses.asdict(CLConfig(mode="finetune"))}
    assert config_hash(a) != config_hash(c)
    assert dict_diff(a, c) == ["cl.mode: was 'fast', now 'finetune'"]
