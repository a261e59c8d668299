"""The short causal convolution on attention's q, k, v (`ModelConfig.conv_kernel`, issue 53): the
fast path equals a per-position loop (outputs and gradients), it is causal, cached decoding equals
the full forward, a checkpoint round-trips, and the field at its off value changes no base's
identity (the shipped bases' saved architecture is what a conv-off config gives)."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from cl_platform.check import ConfigError
from cl_platform.checkpoint import load_checkpoint, model_config_dict, save_checkpoint
from cl_platform.config import config_hash
from cl_platform.memory.fwpkm import FwPKMConfig
from cl_platform.memory.pkm import PKMConfig
from cl_platform.model import PRESETS, CausalConv, FwPKMLM, LayerCache, ModelConfig, causal_conv_naive

V = 61
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("T, K", [(63, 4), (100, 3), (1, 4), (5, 2)])
def test_the_conv_equals_the_naive_loop_in_outputs_and_gradients(T, K):
    torch.manual_seed(0)
    conv = CausalConv(7, K).double()
    x = torch.randn(2, T, 7, dtype=torch.float64, requires_grad=True)
    fast = conv(x)
    ref = causal_conv_naive(x, conv.weight)
    assert torch.allclose(fast, ref, atol=1e-12)
    # One hand-checked value: the first position sees only itself, weighted by the last tap.
    assert torch.allclose(fast[:, 0], x[:, 0] * conv.weight[:, K - 1], atol=1e-12)
    g = torch.randn_like(fast)
    gx_fast, gw_fast = torch.autograd.grad(fast, (x, conv.weight), g)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, conv.weight), g)
    assert torch.allclose(gx_fast, gx_ref, atol=1e-12) and torch.allclose(gw_fast, gw_ref, atol=1e-12)


def test_the_conv_is_causal_and_reaches_exactly_k_minus_1_back():
    torch.manual_seed(0)
    conv, T, K = CausalConv(5, 4), 20, 4
    x = torch.randn(1, T, 5)
    for pos in (0, 7, 19):
        other = x.clone()
        other[:, pos] += 1.0
        changed = (conv(x) - conv(other)).abs().amax(dim=(0, 2)) > 0
        expected = torch.zeros(T, dtype=torch.bool)
        expected[pos:pos + K] = True
        assert torch.equal(changed, expected), pos


def _model(conv_kernel=4, **kw) -> FwPKMLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, window=6, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=8, d_value=16), conv_kernel=conv_kernel, **kw)
    return FwPKMLM(cfg).eval()


def test_the_model_with_the_conv_is_causal():
    model = _model()
    model.set_writes(False)  # a write in a later chunk is causal too, but here only the mixer is under test
    idx = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(idx)
        for pos in (0, 13, 29):
            other = idx.clone()
            other[:, pos] = (other[:, pos] + 1) % V
            diff = (base - model(other)).abs().amax(dim=(0, 2))
            assert (diff[:pos] == 0).all() and diff[pos] > 0, pos


@pytest.mark.parametrize("mixer", ["swa", "full"])
def test_cached_decoding_with_the_conv_equals_the_full_forward(mixer):
    model = _model(mixer=mixer)
    model.set_writes(False)
    idx = torch.randint(0, V, (2, 23), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        pieces, start = [], 0
        for step in (1, 5, 2, 1, 7, 7):  # pieces shorter and longer than the kernel
            pieces.append(model(idx[:, start:start + step], cache=cache))
            start += step
    assert start == 23
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)
    assert cache[0].conv.shape == (2, 3, 3 * 32)  # the last K − 1 inputs of q, k, v
    assert cache[0].pos == 23


def test_the_conv_changes_the_model_and_its_weights_train():
    with_conv, without = _model(4), _model(0)
    assert with_conv.blocks[0].attn.conv is not None and without.blocks[0].attn.conv is None
    idx = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert not torch.allclose(with_conv(idx), without(idx))
    with_conv.train()
    _, loss = with_conv(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert with_conv.blocks[0].attn.conv.weight.grad.abs().sum() > 0
    groups = with_conv.optimizer_groups(weight_decay=0.1, lr=1e-3)
    names = {id(p): g["name"] for g in groups for p in g["params"]}
    assert names[id(with_conv.blocks[0].attn.conv.weight)] == "decay"


def test_a_checkpoint_with_the_conv_round_trips(tmp_path):
    model = _model()
    save_checkpoint(tmp_path / "m.ckpt", "base", model.config, {"model": model.state_dict()})
    data = load_checkpoint(tmp_path / "m.ckpt", "base", model.config)
    assert data["model_config"]["conv_kernel"] == 4
    fields = dict(data["model_config"])
    config = ModelConfig(**{**fields, "fwpkm": FwPKMConfig(**fields["fwpkm"]), "pkm": PKMConfig(**fields["pkm"])})
    assert config == model.config
    again = FwPKMLM(config).eval()
    again.load_state_dict(data["model"])
    idx = torch.randint(0, V, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(again(idx), model(idx))
    # A base made without the conv does not load into a model with it, and says which field differs.
    with pytest.raises(Exception, match="conv_kernel"):
        load_checkpoint(tmp_path / "m.ckpt", "base", dataclasses.replace(model.config, conv_kernel=0))


def test_the_conv_is_off_in_every_preset_and_off_names_the_architecture_before_it():
    for name in PRESETS:
        config = ModelConfig.from_preset(name)
        assert config.conv_kernel == 0
        assert "conv_kernel" not in model_config_dict(config)  # so every key hashed from it is as before
    on = ModelConfig(conv_kernel=4)
    assert model_config_dict(on)["conv_kernel"] == 4
    assert config_hash(model_config_dict(on)) != config_hash(model_config_dict(ModelConfig()))


@pytest.mark.parametrize("base", sorted(p.name for p in (ROOT / "experiments" / "bases").glob("*") if (p / "base.ckpt").is_file()))
def test_every_shipped_base_saved_the_architecture_a_conv_off_config_gives(base):
    # base_key hashes model_config_dict and the checkpoint check compares it: equal dicts, equal
    # keys, the base found and loaded as before the field existed.
    saved = load_checkpoint(ROOT / "experiments" / "bases" / base / "base.ckpt", "base")["model_config"]
    assert "conv_kernel" not in saved
    config = ModelConfig(**{**saved, "fwpkm": FwPKMConfig(**saved["fwpkm"]), "pkm": PKMConfig(**saved["pkm"])})
    assert model_config_dict(config) == saved


def test_the_base_key_is_the_same_with_the_conv_named_off_and_changes_with_it_on(tiny, tmp_path):
    from experiments.setup import base_key, load_setup

    key = base_key(load_setup(tiny.config(tmp_path / "a.yaml")))
    assert base_key(load_setup(tiny.config(tmp_path / "b.yaml"), ["model.conv_kernel=0"])) == key
    assert base_key(load_setup(tiny.config(tmp_path / "c.yaml"), ["model.conv_kernel=4"])) != key


@pytest.mark.parametrize("value", [1, -1, 2.5, True, "4"])
def test_a_bad_kernel_is_named(value):
    with pytest.raises(ConfigError, match=r"ModelConfig\.conv_kernel"):
        ModelConfig(conv_kernel=value)
