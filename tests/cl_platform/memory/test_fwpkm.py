"""FwPKM fast path against the independent test vectors and the loop reference (`fwpkm_naive`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from cl_platform.check import ConfigError
from cl_platform.memory.fwpkm import (
    FastWeightState,
    FwPKM,
    FwPKMConfig,
    NonFiniteWriteError,
    WriteRule,
    fwpkm_chunked,
    init_state,
    zscore,
)
from cl_platform.memory.fwpkm_naive import naive_fwpkm

VECTORS = Path(__file__).parent / "data" / "fwpkm_vectors.pt"


def load_vectors() -> tuple[dict, FwPKMConfig, WriteRule]:
    """The independent float64 case; its config [B, T, d_k, d_v, S, k, C] splits into the
    architecture and the write rule (η = η_K = λ = 1, look-ahead on)."""
    d = torch.load(VECTORS, weights_only=True)
    _, _, dk, dv, S, k, C = d["config"].tolist()
    return d, FwPKMConfig(num_subkeys=S, d_key=dk, d_value=dv, topk=k), WriteRule(chunk=C)


def make_state(keys, values, write_mask=None) -> FastWeightState:
    """A fresh state around given keys and values: no reads, every row writable unless masked."""
    n = values.shape[0]
    mask = torch.ones(n, dtype=torch.bool) if write_mask is None else write_mask
    return FastWeightState(keys, values, torch.zeros(n, dtype=torch.long), mask)


def copy_state(state: FastWeightState, **changes) -> FastWeightState:
    return FastWeightState(*(t.clone() for t in state))._replace(**changes)


def sort_by_index(idx, w):
    order = idx.argsort(-1)
    return idx.gather(-1, order), w.gather(-1, order)


def test_reproduces_independent_vectors():
    d, cfg, rule = load_vectors()
    S, dk = cfg.num_subkeys, cfg.d_key
    assert d["q"].shape[1] % rule.chunk != 0  # the case covers a short last chunk
    state = make_state(d["keys0"].clone().view(1, 2, S, dk // 2), d["values0"].clone())
    after = []
    out = fwpkm_chunked(d["q"], d["v"], d["g"], state, cfg, rule, on_chunk=lambda r: after.append(r))
    i1, w1 = sort_by_index(out.lookup.idx[:, :, 0], out.lookup.weights[:, :, 0])
    i2, w2 = sort_by_index(d["indices"], d["weights"])
    assert torch.equal(i1, i2)
    tol = dict(atol=1e-6, rtol=0)
    torch.testing.assert_close(w1, w2, **tol)
    torch.testing.assert_close(out.vhat, d["vhat"], **tol)
    torch.testing.assert_close(after[0].keys[0], d["keys_after_chunk0"], **tol)
    torch.testing.assert_close(after[0].values, d["values_after_chunk0"], **tol)
    torch.testing.assert_close(state.keys[0], d["keys_final"], **tol)
    torch.testing.assert_close(state.values, d["values_final"], **tol)
    torch.testing.assert_close(out.addr_loss, d["addr_loss"], **tol)


def test_naive_reference_reproduces_vectors():
    d, cfg, rule = load_vectors()
    state = make_state(d["keys0"].view(1, 2, cfg.num_subkeys, cfg.d_key // 2), d["values0"])
    ref = naive_fwpkm(d["q"], d["v"], d["g"], state, cfg, rule)
    torch.testing.assert_close(ref["vhat"].detach(), d["vhat"], atol=1e-6, rtol=0)
    torch.testing.assert_close(ref["states"][-1][1].detach(), d["values_final"], atol=1e-6, rtol=0)
    torch.testing.assert_close(ref["states"][-1][0][0].detach(), d["keys_final"], atol=1e-6, rtol=0)


def random_case(B, T, cfg, seed, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    D = cfg.d_key * cfg.heads
    q = torch.randn(B, T, D, generator=g, dtype=torch.float64) * 0.5
    v = zscore(torch.randn(B, T, cfg.d_value, generator=g, dtype=torch.float64))
    gate = torch.rand(B, T, generator=g, dtype=torch.float64)
    state = init_state(cfg, torch.Generator().manual_seed(seed + 1))
    if requires_grad:
        for t in (q, v, gate):
            t.requires_grad_(True)
    return q, v, gate, state._replace(keys=state.keys.double(), values=state.values.double())


CASES = [
    # (B, T, heads, lookahead, chunk, other rule fields): awkward sizes, T not a multiple of C, batch > 1
    (2, 63, 1, True, 16, {}),
    (1, 20, 2, True, 7, {}),
    (2, 33, 1, False, 10, {}),
    (1, 50, 1, True, 4, {}),  # 13 chunks: the training overlay holds and merges several runs
    (2, 30, 2, True, 8, dict(lr_values=0.5, lr_keys=2.0, addr_weight=0.3)),
]


@pytest.mark.parametrize("B,T,H,lookahead,C,rates", CASES)
def test_fast_matches_naive_outputs_states_and_gradients(B, T, H, lookahead, C, rates):
    cfg = FwPKMConfig(num_subkeys=6, d_key=8, d_value=5, heads=H, topk=3)
    rule = WriteRule(chunk=C, lookahead=lookahead, **rates)
    q, v, g, state = random_case(B, T, cfg, seed=T + H, requires_grad=True)
    ref = naive_fwpkm(q, v, g, state, cfg, rule)

    fast_states = []
    out = fwpkm_chunked(q, v, g, state, cfg, rule, on_chunk=lambda r: fast_states.append((r.keys, r.values)))
    assert torch.equal(out.lookup.idx.sort(-1).values, ref["idx"].sort(-1).values)
    torch.testing.assert_close(out.vhat, ref["vhat"], atol=1e-10, rtol=1e-10)
    assert len(fast_states) == len(ref["states"]) == -(-T // C)
    for (fk, fv), (rk, rv) in zip(fast_states, ref["states"]):
        torch.testing.assert_close(fk, rk.detach(), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(fv, rv.detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(state.values, ref["states"][-1][1].detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(state.keys, ref["states"][-1][0].detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.addr_loss, torch.stack(ref["addr_loss"]).detach(), atol=1e-10, rtol=1e-10)

    # Gradients through the writes: a loss on every read-out and on the final keys reaches q, v, g
    # of earlier chunks only through ΔV and ΔK.
    final_keys = fast_states[-1][0]  # the differentiable key state the last chunk left
    w_out = torch.randn(out.vhat.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w_key = torch.randn(final_keys.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    fast_grads = torch.autograd.grad((out.vhat * w_out).sum() + (final_keys * w_key).sum(), (q, v, g))
    ref_grads = torch.autograd.grad((ref["vhat"] * w_out).sum() + (ref["states"][-1][0] * w_key).sum(), (q, v, g))
    for name, fg, rg in zip("qvg", fast_grads, ref_grads):
        assert rg.abs().sum() > 0, name
        torch.testing.assert_close(fg, rg, atol=1e-9, rtol=1e-8, msg=f"gradient of {name}")


def test_gradient_flows_through_writes_into_earlier_chunks():
    """v of chunk 0 only affects later outputs through the value write (it is not read after chunk 0)."""
    cfg = FwPKMConfig(num_subkeys=6, d_key=8, d_value=5, topk=3)
    q, v, g, state = random_case(1, 24, cfg, seed=3, requires_grad=True)
    out = fwpkm_chunked(q, v, g, state, cfg, WriteRule(chunk=8))
    (gv,) = torch.autograd.grad(out.vhat[:, 8:].sum(), v)
    assert gv[:, 1:8].abs().sum() > 0  # targets y_t = v_{t+1} of chunk 0 moved the rows chunk 1 reads
    assert gv[:, 16:].abs().sum() == 0  # nothing flows backwards in time


def test_write_mask_freezes_rows_bit_for_bit_in_both_modes():
    cfg, rule = FwPKMConfig(num_subkeys=6, d_key=8, d_value=5, topk=3), WriteRule(chunk=8)
    q, v, g, start = random_case(2, 40, cfg, seed=11)
    mask = torch.ones(cfg.num_slots, dtype=torch.bool)
    mask[::2] = False
    start = start._replace(write_mask=mask)
    for grad in (False, True):
        state = copy_state(start)
        qq = q.clone().requires_grad_(grad)
        fwpkm_chunked(qq, v, g, state, cfg, rule)
        assert torch.equal(state.values[~mask], start.values[~mask])
        assert not torch.equal(state.values[mask], start.values[mask])
    ref = naive_fwpkm(q, v, g, start, cfg, rule)
    torch.testing.assert_close(state.values, ref["states"][-1][1].detach(), atol=1e-10, rtol=1e-10)


def test_training_and_inference_modes_agree():
    cfg, rule = FwPKMConfig(num_subkeys=8, d_key=8, d_value=6, topk=4), WriteRule(chunk=10)
    q, v, g, start = random_case(2, 37, cfg, seed=5)
    s_graph, s_plain = copy_state(start), copy_state(start)
    a = fwpkm_chunked(q.clone().requires_grad_(True), v, g, s_graph, cfg, rule)
    with torch.no_grad():
        b = fwpkm_chunked(q, v, g, s_plain, cfg, rule)
    torch.testing.assert_close(a.vhat.detach(), b.vhat, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(s_graph.values, s_plain.values, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(s_graph.keys, s_plain.keys, atol=1e-12, rtol=1e-12)
    assert torch.equal(s_graph.read_counts, s_plain.read_counts)
    for name in ("value_update_norm", "key_update_norm"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("grad", [False, True])
def test_one_call_changes_keys_values_and_counts_in_place_and_reports_the_write(grad):
    cfg, rule = FwPKMConfig(num_subkeys=6, d_key=8, d_value=5, topk=3), WriteRule(chunk=6)
    q, v, g, start = random_case(2, 20, cfg, seed=13)
    state = copy_state(start)
    live = [t.data_ptr() for t in state]
    records = []
    out = fwpkm_chunked(q.clone().requires_grad_(grad), v, g, state, cfg, rule,
                        on_chunk=lambda r: records.append((r.keys.detach(), r.values.detach())))
    assert [t.data_ptr() for t in state] == live  # the same tensors, changed in place
    assert torch.equal(state.keys, records[-1][0]) and torch.equal(state.values, records[-1][1])
    assert not torch.equal(state.keys, start.keys) and not torch.equal(state.values, start.values)
    assert int(state.read_counts.sum()) == 2 * 20 * 3
    assert torch.equal(state.write_mask, start.write_mask)
    torch.testing.assert_close(out.key_update_norm, (state.keys - start.keys).norm(), atol=0, rtol=0)
    before = [start.values] + [values for _, values in records[:-1]]
    sq = sum((after - b).pow(2).sum() for (_, after), b in zip(records, before))
    torch.testing.assert_close(out.value_update_norm, sq.sqrt(), atol=1e-12, rtol=1e-12)
    assert out.value_update_norm.grad_fn is None and out.key_update_norm.grad_fn is None

    frozen = copy_state(start)
    out = fwpkm_chunked(q, v, g, frozen, cfg, rule, write=False)
    assert torch.equal(frozen.keys, start.keys) and torch.equal(frozen.values, start.values)
    assert out.addr_loss.numel() == 0 and out.value_update_norm == 0 and out.key_update_norm == 0
    assert int(frozen.read_counts.sum()) == 2 * 20 * 3  # reads are counted without writes too


def test_read_counts_count_every_pick():
    cfg = FwPKMConfig(num_subkeys=6, d_key=8, d_value=5, heads=2, topk=3)
    q, v, g, state = random_case(2, 13, cfg, seed=2)
    out = fwpkm_chunked(q, v, g, state, cfg, WriteRule(chunk=8))
    assert int(state.read_counts.sum()) == 2 * 13 * 2 * 3
    assert torch.equal(state.read_counts, torch.bincount(out.lookup.idx.reshape(-1), minlength=cfg.num_slots))


# --- the module ------------------------------------------------------------------------------


def small_layer(seed=0, chunk=8, persistence="persist", **arch):
    torch.manual_seed(seed)
    cfg = FwPKMConfig(num_subkeys=8, d_key=8, d_value=6, topk=4, **arch)
    return FwPKM(16, cfg, WriteRule(chunk=chunk, persistence=persistence)).double()


def test_module_matches_naive_composition_and_slow_gradients():
    layer = small_layer()
    x = torch.randn(2, 21, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    before = layer.snapshot()
    y = layer(x)
    loss = (y * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum()
    grads = torch.autograd.grad(loss, list(layer.parameters()))
    after = layer.snapshot()

    layer.restore(before)
    q = layer.proj_q(layer.norm_q(x))
    v = zscore(layer.proj_v(layer.norm_v(x)))
    g = torch.sigmoid(layer.proj_g(layer.norm_g(x))).squeeze(-1)
    ref = naive_fwpkm(q, v, g, before, layer.config, layer.rule)
    o = g.unsqueeze(-1) * ref["vhat"] + (1 - g).unsqueeze(-1) * v
    y_ref = layer.proj_o(layer.norm_o(o))
    torch.testing.assert_close(y, y_ref, atol=1e-10, rtol=1e-10)
    ref_grads = torch.autograd.grad((y_ref * torch.linspace(-1, 1, 16, dtype=torch.float64)).sum(), list(layer.parameters()))
    for (name, _), a, b in zip(layer.named_parameters(), grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-8, msg=name)
    torch.testing.assert_close(after.values, ref["states"][-1][1].detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(after.keys, ref["states"][-1][0].detach(), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("grad", [False, True])
def test_causal_across_chunk_boundaries_with_writes(grad):
    layer = small_layer(chunk=5)
    x = torch.randn(2, 23, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    snap = layer.snapshot()
    with torch.set_grad_enabled(grad):
        y0 = layer(x.requires_grad_(grad))
        for t in (3, 4, 5, 9, 14, 20):
            layer.restore(snap)
            x2 = x.detach().clone()
            x2[:, t + 1 :] += torch.randn_like(x2[:, t + 1 :])
            y1 = layer(x2.requires_grad_(grad))
            assert torch.equal(y0[:, : t + 1], y1[:, : t + 1]), t
            assert not torch.allclose(y0[:, t + 1 :], y1[:, t + 1 :])


def test_state_persists_across_calls_like_one_long_call():
    layer = small_layer(chunk=6)
    x = torch.randn(1, 24, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    snap = layer.snapshot()
    with torch.no_grad():
        whole = layer(x)
        end_whole = layer.snapshot()
        layer.restore(snap)
        parts = torch.cat([layer(x[:, :12]), layer(x[:, 12:])], dim=1)
    torch.testing.assert_close(parts, whole, atol=1e-12, rtol=0)
    torch.testing.assert_close(layer.values, end_whole.values, atol=1e-12, rtol=0)


def test_snapshot_restore_reset_and_disabled_writes():
    layer = small_layer()
    x = torch.randn(1, 16, 16, dtype=torch.float64)
    snap = layer.snapshot()
    with torch.no_grad():
        layer.writes_enabled = False
        y_a = layer(x)
        assert torch.equal(layer.values, snap.values) and torch.equal(layer.keys, snap.keys)
        y_b = layer(x)
        assert torch.equal(y_a, y_b)  # nothing written, same reads
        layer.writes_enabled = True
        layer(x)
        assert not torch.equal(layer.values, snap.values)
        layer.restore(snap)
        assert torch.equal(layer.values, snap.values) and torch.equal(layer.keys, snap.keys)
        layer.write_mask[1] = False
        counts, mask = layer.read_counts.clone(), layer.write_mask.clone()
        layer.reset(torch.Generator().manual_seed(0))
        ref = init_state(layer.config, torch.Generator().manual_seed(0))
        assert torch.equal(layer.values, ref.values.double()) and torch.equal(layer.keys, ref.keys.double())
        # reset re-draws the memory content only: the counts and the mask are the strategy's
        assert torch.equal(layer.read_counts, counts) and torch.equal(layer.write_mask, mask)


def test_snapshot_restore_round_trips_every_part_of_the_state():
    layer = small_layer()
    x = torch.randn(2, 20, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    start = layer.snapshot()
    assert start._fields == ("keys", "values", "read_counts", "write_mask")
    layer.write_mask[::3] = False
    with torch.no_grad():
        layer(x)
    written = layer.snapshot()
    for field in FastWeightState._fields:
        assert not torch.equal(getattr(written, field), getattr(start, field)), field
    y_next = layer(x.flip(1).requires_grad_(True))  # the training path changes all but the mask
    y_next.sum().backward()
    for field in ("keys", "values", "read_counts"):
        assert not torch.equal(getattr(layer, field), getattr(written, field)), field

    for snap in (written, start, written):
        layer.restore(snap)
        for field in FastWeightState._fields:
            live, saved = getattr(layer, field), getattr(snap, field)
            assert live.dtype == saved.dtype and torch.equal(live, saved), field
            assert live.data_ptr() != saved.data_ptr()  # restored into the buffers, not aliased
    # restored, the layer computes exactly what it computed the first time from that state
    torch.testing.assert_close(layer(x.flip(1)), y_next.detach(), rtol=0, atol=0)

    with pytest.raises(TypeError, match="FastWeightState"):
        layer.restore(tuple(start)[:2])
    with pytest.raises(ValueError, match="write_mask"):
        layer.restore(start._replace(write_mask=start.write_mask[:-1]))


def test_replacing_the_rule_changes_later_writes_not_the_architecture():
    a, b = small_layer(), small_layer()
    assert torch.equal(a.values, b.values)
    x = torch.randn(1, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    b.rule = WriteRule(chunk=8, lr_values=0.0, lr_keys=0.0)
    start = b.snapshot()
    with torch.no_grad():
        a(x), b(x)
    assert torch.equal(b.keys, start.keys) and torch.equal(b.values, start.values)  # η = η_K = 0
    assert not torch.equal(a.values, start.values)
    with pytest.raises(TypeError, match="WriteRule"):
        FwPKM(16, a.config, rule={"chunk": 8})
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.rule.chunk = 4  # rules are values: a layer gets a new one, shared rules never change


def test_reset_per_call_persistence_starts_every_call_fresh():
    layer = small_layer(persistence="reset_per_call")
    x = torch.randn(1, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.manual_seed(3)
        a = layer(x)
        torch.manual_seed(3)
        b = layer(x)
    assert torch.equal(a, b)


def test_fast_weights_are_buffers_not_parameters():
    layer = small_layer()
    names = {n for n, _ in layer.named_parameters()}
    assert not names & {"keys", "values", "write_mask", "read_counts"}
    assert {"keys", "values", "write_mask", "read_counts"} <= set(layer.state_dict())


def test_usage_stats_formulas():
    layer = small_layer()
    layer.read_counts.zero_()
    layer.read_counts[:4] = torch.tensor([3, 1, 0, 4])  # N = 64 slots, 8 reads
    stats = layer.usage_stats()
    assert stats["coverage"] == pytest.approx(3 / 64)
    assert stats["collision_rate"] == pytest.approx(7 / 8)
    p = torch.tensor([3, 1, 4], dtype=torch.float64) / 8
    assert stats["kl_uniform"] == pytest.approx(float((p * torch.log(p * 64)).sum()))


def test_non_finite_write_is_reported_with_layer_and_chunk():
    layer = small_layer(chunk=4)
    layer.name = "layer3.fwpkm"
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        layer.proj_v.weight[0, 0] = float("inf")
        before = layer.snapshot()
        with pytest.raises(NonFiniteWriteError, match=r"layer3\.fwpkm.*chunk 0"):
            layer(x)
    assert torch.equal(layer.values, before.values)


@pytest.mark.parametrize(
    "field,value",
    [("num_subkeys", 0), ("d_key", 7), ("d_value", 1), ("topk", 9), ("heads", 0), ("gate", "yes"), ("topk", True)],
)
def test_invalid_architecture_names_the_field(field, value):
    kwargs = dict(num_subkeys=8, d_key=8, d_value=4, topk=4)
    kwargs[field] = value
    with pytest.raises(ConfigError, match=rf"^FwPKMConfig\.{field}="):
        FwPKMConfig(**kwargs)


@pytest.mark.parametrize(
    "field,value",
    [("chunk", 1), ("lr_values", float("nan")), ("lr_keys", -1.0), ("addr_weight", "1"), ("lookahead", 1),
     ("persistence", "sometimes")],
)
def test_invalid_write_rule_names_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^WriteRule\.{field}="):
        WriteRule(**{field: value})


def test_reset_slots_reinitialises_only_the_given_rows():
    layer = small_layer()
    before = layer.snapshot()
    ids = torch.tensor([3, 17, 40])
    layer.reset_slots(ids, torch.Generator().manual_seed(5))
    changed = (layer.values != before.values).any(-1).nonzero().squeeze(-1)
    assert torch.equal(changed, ids)
    assert torch.equal(layer.keys, before.keys)
    fresh = torch.empty(3, layer.config.d_value, dtype=torch.float64).normal_(
        0.0, 1.0 / layer.config.d_value**0.5, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(layer.values[ids], fresh)  # drawn in the table's dtype (float64 here)


def test_under_autocast_the_memory_math_stays_float32():
    # bf16-mixed runs: the projections may run in bfloat16, the lookup, read-out and writes may not.
    torch.manual_seed(0)
    cfg = FwPKMConfig(num_subkeys=8, d_key=8, d_value=6, topk=4)
    layer = FwPKM(16, cfg, WriteRule(chunk=8))
    x = torch.randn(2, 21, 16, generator=torch.Generator().manual_seed(1))
    seen = {}
    for name in ("proj_q", "proj_v", "proj_g"):
        getattr(layer, name).register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o))
    before = layer.snapshot()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    assert seen["proj_q"].dtype == torch.bfloat16  # autocast was on for the slow weights
    after = layer.snapshot()
    assert after.values.dtype == after.keys.dtype == torch.float32
    # The same q, v, g through the memory outside autocast give the same writes, bit for bit.
    q, v = seen["proj_q"].float(), zscore(seen["proj_v"].float())
    g = torch.sigmoid(seen["proj_g"].float().squeeze(-1))
    ref = copy_state(before)
    fwpkm_chunked(q, v, g, ref, cfg, layer.rule, write=True)
    assert torch.equal(ref.values, after.values) and torch.equal(ref.keys, after.keys)
    assert not torch.equal(before.values, after.values)


def test_counters_count_calls_and_chunk_writes():
    layer = small_layer(chunk=6)
    x = torch.randn(1, 20, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        layer(x)  # chunks of 6: 0-5, 6-11, 12-17, 18-19
        assert (layer.calls, layer.writes) == (1, 4)
        layer.writes_enabled = False
        layer(x)
        assert (layer.calls, layer.writes) == (2, 4)  # a read without writes
        layer.writes_enabled = True
        layer.rule = dataclasses.replace(layer.rule, chunk=20)
        before = layer.values.clone()
        layer(x)  # one write over the whole context
        assert (layer.calls, layer.writes) == (3, 5) and not torch.equal(layer.values, before)
        layer.reset_counters()
        assert (layer.calls, layer.writes) == (0, 0)
