import dataclasses

import pytest
import torch
import torch.nn.functional as F

from cl_platform.check import ConfigError
from cl_platform.constants import IGNORE_INDEX
from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.memory.pkm import PKMConfig
from cl_platform.model import (
    PRESETS,
    FwPKMLM,
    ModelConfig,
    _rope_cos_sin,
    apply_rope,
    count_parameters,
    sliding_window_attention,
)
from cl_platform.optim import MixedAdamW

V = 61  # awkward vocabulary


def _attn_only(n_layer=2, window=4, **kw) -> FwPKMLM:
    """A tiny model without memories, so that only attention mixes tokens."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=V, n_layer=n_layer, d_model=32, n_head=2, window=window, fwpkm_layers=[], **kw
    )
    return FwPKMLM(cfg).eval()


def _changed_positions(model, idx, pos) -> torch.Tensor:
    """Positions whose logits change when token `pos` is replaced."""
    other = idx.clone()
    other[:, pos] = (other[:, pos] + 1) % V
    with torch.no_grad():
        diff = (model(idx) - model(other)).abs().amax(dim=(0, 2))  # (T,)
    return diff > 1e-6


@pytest.mark.parametrize("n_layer", [1, 2])
def test_sliding_window_reach(n_layer):
    window, T = 4, 23
    model = _attn_only(n_layer=n_layer, window=window)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    pos = 3
    changed = _changed_positions(model, idx, pos)
    # each layer looks window − 1 tokens back (window includes self), so L layers reach L·(window − 1)
    reach = n_layer * (window - 1)
    expected = torch.zeros(T, dtype=torch.bool)
    expected[pos : pos + reach + 1] = True
    assert torch.equal(changed, expected)


def _dense_band_attention(q, k, v, window):
    """The reference: SDPA over all T x T scores with the band mask (key j <= query i, i - j < window)."""
    T = q.shape[2]
    i, j = torch.arange(T).unsqueeze(1), torch.arange(T).unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (i - j < window))


@pytest.mark.parametrize("T, window", [(63, 8), (100, 16), (128, 16), (129, 16), (7, 16)])
def test_blocked_sliding_window_attention_equals_the_dense_band(T, window):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fast, ref = sliding_window_attention(q, k, v, window), _dense_band_attention(q, k, v, window)
    assert fast.shape == ref.shape and torch.allclose(fast, ref, atol=1e-12, rtol=0)
    w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((fast * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))
    assert all(torch.allclose(a, b, atol=1e-12, rtol=0) for a, b in zip(*grads))
    # The window is real: plain causal attention differs wherever a query has more than `window` keys.
    if T > window:
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert (causal - fast)[:, :, window:].abs().amax() > 1e-3
        assert torch.allclose(causal[:, :, :window], fast[:, :, :window], atol=1e-12, rtol=0)


def test_causality_without_memory():
    model = _attn_only(window=100)  # window > T: plain causal path
    idx = torch.randint(0, V, (1, 17), generator=torch.Generator().manual_seed(2))
    for pos in (0, 8, 16):
        changed = _changed_positions(model, idx, pos)
        assert not changed[:pos].any() and changed[pos:].all()


def test_full_mixer_is_full_at_eval_and_pswa_in_training():
    T, window = 20, 4
    model = _attn_only(n_layer=1, window=window, mixer="full", pswa_prob=1.0)
    idx = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(3))
    assert _changed_positions(model, idx, 0)[-1]  # eval: full attention reaches back to 0
    model.train()  # dropout is 0, so train mode differs only by the pSWA draw
    assert not _changed_positions(model, idx, 0)[-1]  # pswa_prob=1: always a window
    model.blocks[0].attn.pswa_prob = 0.0
    assert _changed_positions(model, idx, 0)[-1]


def test_pswa_draws_are_seeded_by_manual_seed():
    model = _attn_only(n_layer=4, window=3, mixer="full", pswa_prob=0.5).train()
    idx = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(4))
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(torch.stack([model(idx) for _ in range(3)]))
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


def test_rope_scores_depend_on_relative_position_only():
    cos, sin = _rope_cos_sin(12, 8, 10000.0, torch.device("cpu"))
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    rq = apply_rope(q.expand(1, 1, 12, 8), cos, sin)[0, 0]  # (T, hd)
    rk = apply_rope(k.expand(1, 1, 12, 8), cos, sin)[0, 0]
    torch.testing.assert_close((rq[5] * rk[2]).sum(), (rq[9] * rk[6]).sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(12), rtol=1e-5, atol=1e-5)


def test_loss_is_mean_token_cross_entropy_ignoring_padding():
    model = _attn_only()
    idx = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(5))
    targets = idx.roll(-1, dims=1)
    targets[:, -3:] = IGNORE_INDEX
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 9, V)
    keep = targets != -100
    expected = F.cross_entropy(logits[keep], targets[keep])
    torch.testing.assert_close(loss, expected)


def _small(**overrides) -> FwPKMLM:
    """The small preset at test speed: short chunks and window, small vocabulary and memories."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        ModelConfig.from_preset("small"),
        vocab_size=V,
        window=8,
        fwpkm=FwPKMConfig(num_subkeys=16, d_key=16, d_value=16),
        pkm=PKMConfig(num_subkeys=8, d_key=16, d_value=32, topk=4),
        **overrides,
    )
    return FwPKMLM(cfg, WriteRule(chunk=8))


@pytest.mark.parametrize("grad", [False, True])
def test_causality_with_fwpkm_across_chunk_boundaries(grad):
    # grad=True takes the training path (writes kept differentiable), grad=False the in-place one
    model = _small(d_model=32, n_head=2).train(grad)
    idx = torch.randint(0, V, (2, 21), generator=torch.Generator().manual_seed(6))
    start = model.snapshot_memory()

    def logits(tokens):
        model.restore_memory(start)
        with torch.set_grad_enabled(grad):
            return model(tokens).detach()

    base = logits(idx)
    for pos in (0, 7, 8, 13, 16, 20):  # chunk = 8: last / first token of a chunk, mid-chunk
        other = idx.clone()
        other[:, pos] = (other[:, pos] + 1) % V
        diff = (logits(other) - base).abs().amax(dim=(0, 2))
        assert (diff[:pos] == 0).all(), f"token {pos} changed earlier logits"
        assert diff[pos] > 0


def test_memory_state_persists_and_snapshot_restore_reset_are_exact():
    model = _small(d_model=32, n_head=2).eval()
    idx = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(7))
    assert len(model.fwpkm_layers()) == 2
    with torch.no_grad():
        snap = model.snapshot_memory()
        first = model(idx)
        assert not torch.equal(model(idx), first)  # the writes of the first call are read
        model.restore_memory(snap)
        torch.testing.assert_close(model(idx), first, rtol=0, atol=0)

        model.set_writes(False)
        model.restore_memory(snap)
        frozen = model(idx)
        torch.testing.assert_close(model(idx), frozen, rtol=0, atol=0)
        for layer, s in zip(model.fwpkm_layers(), snap):
            assert torch.equal(layer.values, s.values)

        model.reset_memory(torch.Generator().manual_seed(9))
        a = model.snapshot_memory()
        model.reset_memory(torch.Generator().manual_seed(9))
        b = model.snapshot_memory()
    for sa, sb in zip(a, b):
        assert torch.equal(sa.keys, sb.keys) and torch.equal(sa.values, sb.values)
    with pytest.raises(ValueError, match="restore_memory"):
        model.restore_memory(snap[:1])


def test_small_preset_training_reduces_loss():
    model = _small(pkm_layers=[2]).train()  # FwPKM at 1, 3 and a static PKM at 2
    opt = MixedAdamW(model.optimizer_groups(weight_decay=0.1, lr=3e-3), lr=3e-3)
    data = torch.randint(0, V, (2, 33), generator=torch.Generator().manual_seed(8))
    idx, targets = data[:, :-1], data[:, 1:]
    start = model.snapshot_memory()
    losses = []
    for _ in range(8):
        model.restore_memory(start)  # the same memory each step, so the losses compare
        _, loss = model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.5, losses
    assert model.blocks[2].ffn.values.weight.grad.is_sparse
    assert model.blocks[1].fwpkm.proj_q.weight.grad.abs().sum() > 0  # the LM loss reaches FwPKM


def test_optimizer_groups_cover_each_trainable_parameter_once():
    model = _small(pkm_layers=[2])
    model.blocks[0].attn_norm.weight.requires_grad_(False)  # frozen parameters are left out
    groups = model.optimizer_groups(weight_decay=0.1, lr=1e-3)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"decay", "no_decay", "pkm_values"}
    ids = [id(p) for g in groups for p in g["params"]]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert len(ids) == len(set(ids)) and set(ids) == trainable
    assert not {id(b) for b in model.buffers()} & set(ids)  # fast weights are never optimised

    assert by_name["pkm_values"]["sparse"] and by_name["pkm_values"]["weight_decay"] == 0
    assert [id(p) for p in by_name["pkm_values"]["params"]] == [id(model.blocks[2].ffn.values.weight)]
    decay = {id(p) for p in by_name["decay"]["params"]}
    no_decay = {id(p) for p in by_name["no_decay"]["params"]}
    assert by_name["decay"]["weight_decay"] == 0.1 and by_name["no_decay"]["weight_decay"] == 0
    assert id(model.wte.weight) in decay and model.lm_head.weight is model.wte.weight
    assert id(model.blocks[1].attn.qkv.weight) in decay
    assert id(model.blocks[1].fwpkm.proj_q.weight) in decay
    assert id(model.blocks[1].fwpkm.proj_g.weight) in no_decay
    assert id(model.blocks[1].fwpkm.proj_q.bias) in no_decay
    assert id(model.blocks[2].ffn.keys) in no_decay
    assert id(model.norm_f.weight) in no_decay
    MixedAdamW(groups)  # accepted as is


def test_presets_and_window_default():
    small = ModelConfig.from_preset("small")
    assert small == ModelConfig() and small.preset == "small"  # the field defaults are the small preset
    assert (small.n_layer, small.d_model, small.n_head, small.vocab_size) == (4, 256, 4, None)
    assert small.fwpkm_layers == [1, 3] and small.pkm_layers == []
    assert small.fwpkm == FwPKMConfig() and small.pkm == PKMConfig() and small.mixer == "swa"
    assert small.window == 128
    paper = ModelConfig.from_preset("paper")
    assert paper.preset == "paper" and (paper.n_layer, paper.d_model, paper.fwpkm_layers) == (12, 768, [2, 6, 10])
    assert paper.window == 512 and paper.fwpkm == FwPKMConfig(num_subkeys=512, d_key=512, d_value=512)
    combo = ModelConfig.from_preset("paper_pkm")
    assert combo.pkm_layers == [6] and combo.fwpkm_layers == [2, 10] and combo.fwpkm == paper.fwpkm
    assert (combo.pkm.num_subkeys, combo.pkm.d_key, combo.pkm.d_value) == (512, 512, 768)
    assert set(PRESETS) == {"small", "paper", "paper_pkm"}
    for name in PRESETS:  # the window is the model's own field: changing it touches nothing else
        wide = dataclasses.replace(ModelConfig.from_preset(name), window=64)
        assert wide.window == 64 and wide.fwpkm == ModelConfig.from_preset(name).fwpkm


def test_vocab_size_must_be_set_before_building():
    with pytest.raises(ValueError, match="vocab_size is None; set it from the tokenizer"):
        FwPKMLM(ModelConfig())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ModelConfig.from_preset("huge"), r"unknown preset 'huge'.*\['paper', 'paper_pkm', 'small'\]"),
        (lambda: ModelConfig(preset="huge"), r"ModelConfig\.preset='huge': must be one of \['paper', 'paper_pkm', 'small'\]"),
        (lambda: ModelConfig(vocab_size=0), r"ModelConfig\.vocab_size=0"),
        (lambda: ModelConfig(fwpkm_layers=[4]), r"fwpkm_layers=\[4\]: layer index 4 out of range; allowed 0..3"),
        (lambda: ModelConfig(pkm_layers=[-1]), r"pkm_layers=\[-1\]: layer index -1"),
        (lambda: ModelConfig(fwpkm_layers=[1, 1]), r"fwpkm_layers=\[1, 1\]: has a repeated"),
        (lambda: ModelConfig(pkm_layers=[3]), r"pkm_layers=\[3\]: overlaps fwpkm_layers at layer\(s\) \[3\]"),
        (lambda: ModelConfig(d_model=250), r"ModelConfig\.d_model=250: must be divisible by n_head=4"),
        (lambda: ModelConfig(d_model=12, n_head=4), r"d_model / n_head = 3 must be even"),
        (lambda: ModelConfig(mixer="gdn"), r"mixer='gdn': must be one of \('swa', 'full'\)"),
        (lambda: ModelConfig(pswa_prob=1.5), r"ModelConfig\.pswa_prob=1\.5"),
        (lambda: ModelConfig(window=0), r"ModelConfig\.window=0"),
        (lambda: ModelConfig(window=None), r"ModelConfig\.window=None"),
        (lambda: ModelConfig(fwpkm_layers="1,3"), r"fwpkm_layers='1,3': must be a list of ints"),
        (lambda: ModelConfig(fwpkm={"num_subkeys": 8}), r"ModelConfig\.fwpkm=.*must be a FwPKMConfig"),
        (lambda: ModelConfig(pkm=PKMConfig(topk=500)), r"PKMConfig\.topk"),
    ],
)
def test_config_validation_names_the_field(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_write_rules_by_layer_name():
    model = _small()
    assert model.write_rules() == {"fwpkm1": WriteRule(chunk=8), "fwpkm3": WriteRule(chunk=8)}
    slow, still = WriteRule(chunk=8, lr_values=0.5), WriteRule(chunk=8, lr_values=0.0, lr_keys=0.0)
    model.set_write_rules(slow, {"fwpkm3": still})
    assert model.write_rules() == {"fwpkm1": slow, "fwpkm3": still}
    assert model.blocks[3].fwpkm.rule is still
    with pytest.raises(ValueError, match=r"unknown FwPKM layer\(s\) \['fwpkm2'\].*\['fwpkm1', 'fwpkm3'\]"):
        model.set_write_rules(WriteRule(), {"fwpkm2": WriteRule()})
    with pytest.raises(TypeError, match="fwpkm1 must be a WriteRule"):
        model.set_write_rules(WriteRule(), {"fwpkm1": {"chunk": 8}})
    assert model.write_rules() == {"fwpkm1": slow, "fwpkm3": still}  # a refused call changes nothing

    # the rules act: the layer with η = η_K = 0 keeps its memory, the other one writes
    idx = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(10))
    before = model.snapshot_memory()
    with torch.no_grad():
        model(idx)
    after = model.snapshot_memory()
    assert not torch.equal(after[0].values, before[0].values)
    assert torch.equal(after[1].values, before[1].values) and torch.equal(after[1].keys, before[1].keys)
    model.set_write_rules(WriteRule(chunk=8))
    assert set(model.write_rules().values()) == {WriteRule(chunk=8)}


def test_parameter_counts_small_and_paper(capsys):
    with torch.device("meta"):  # shapes only: the paper model holds ~0.5G values
        counts = {name: count_parameters(FwPKMLM(dataclasses.replace(ModelConfig.from_preset(name), vocab_size=50304)))
                  for name in ("small", "paper", "paper_pkm")}
    with capsys.disabled():
        for name, c in counts.items():
            print(f"\n{name}: " + ", ".join(f"{k}={v / 1e6:.2f}M" for k, v in c.items()), end="")
        print()

    # FwPKM state per layer: keys H·2·S·(d_k/2) + values S²·d_v
    assert counts["small"]["fast_state"] == 2 * (2 * 128 * 64 + 128**2 * 128)
    assert counts["paper"]["fast_state"] == 3 * (2 * 512 * 256 + 512**2 * 512)
    paper = counts["paper"]
    assert paper["total"] == paper["slow"] + paper["fast_state"]
    assert paper["slow"] == paper["trainable"] == paper["active_slow"]  # no static PKM
    for name in ("paper", "paper_pkm"):
        assert 100e6 < counts[name]["active_slow"] < 130e6, (name, counts[name])
    # the static PKM's table is mostly inactive: it reads heads·topk = 128 of 262,144 rows
    combo = counts["paper_pkm"]
    assert combo["slow"] - combo["active_slow"] == (512**2 - 4 * 32) * 768
