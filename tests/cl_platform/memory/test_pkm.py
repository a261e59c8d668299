import pytest
import torch

from cl_platform.check import ConfigError
from cl_platform.memory import fwpkm, pkm, product_keys
from cl_platform.memory.pkm import PKM, PKMConfig, pkm_reference
from cl_platform.memory.product_keys import IDW_EPS, product_key_lookup
from cl_platform.optim import MixedAdamW

# Awkward sizes: odd widths, S not a power of two, k·k candidates > S, several heads.
D_MODEL = 10
AWKWARD = dict(num_subkeys=5, d_key=6, d_value=7, heads=3, topk=3)


def _module(score: str) -> PKM:
    torch.manual_seed(0)
    m = PKM(D_MODEL, PKMConfig(score=score, **AWKWARD)).double()
    # non-trivial norm weight and bias so their gradients are tested too
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.query.bias.normal_(std=0.1)
        m.query.weight.normal_(std=0.5)  # spread queries so that the top-k is not degenerate
        m.out_proj.weight.normal_(std=0.5)
    return m


def _grads(m: PKM, x: torch.Tensor, out: torch.Tensor, upstream: torch.Tensor) -> dict:
    (out * upstream).sum().backward()
    grads = {name: p.grad.to_dense() if p.grad.is_sparse else p.grad for name, p in m.named_parameters()}
    grads["x"] = x.grad
    return grads


@pytest.mark.parametrize("score", ["idw", "dot"])
def test_pkm_matches_loop_reference_outputs_and_gradients(score):
    m = _module(score)
    x = torch.randn(2, 5, D_MODEL, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 5, D_MODEL, dtype=torch.float64)

    out = m(x)
    assert m.values.weight.grad is None
    fast = _grads(m, x, out, upstream)
    assert m.values.weight.grad.is_sparse

    m.zero_grad(set_to_none=True)
    x.grad = None
    ref_out = pkm_reference(x, m, m.values.weight)
    ref = _grads(m, x, ref_out, upstream)

    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    assert fast.keys() == ref.keys()
    for name in fast:
        torch.testing.assert_close(fast[name], ref[name], rtol=1e-8, atol=1e-10, msg=name)
    # only rows that were read get a value gradient
    touched = (fast["values.weight"] != 0).any(-1).sum().item()
    assert 0 < touched <= 2 * 5 * AWKWARD["heads"] * AWKWARD["topk"]


def test_idw_lookup_ranks_by_score_and_indexes_product_slots():
    m = _module("idw")
    c = m.config
    half = c.d_key // 2
    q = torch.randn(1, 4, c.heads, c.d_key, dtype=torch.float64)
    look = m.lookup(q)
    assert look.idx.min() >= 0 and look.idx.max() < c.num_slots
    # recompute each picked slot's score from its two sub-keys: s = s¹_a + s²_b
    a, b = look.idx // c.num_subkeys, look.idx % c.num_subkeys
    for h in range(c.heads):
        d1 = ((q[0, :, h, None, :half] - m.keys[h, 0][a[0, :, h]]) ** 2).sum(-1)
        d2 = ((q[0, :, h, None, half:] - m.keys[h, 1][b[0, :, h]]) ** 2).sum(-1)
        expected = -torch.log(1e-3 + d1) - torch.log(1e-3 + d2)
        assert (expected[:, :-1] >= expected[:, 1:]).all()  # sorted best first
        torch.testing.assert_close(look.weights[0, :, h], expected.softmax(-1))


@pytest.mark.parametrize("score", ["idw", "dot"])
def test_lookup_picks_the_top_k_of_all_slots(score):
    """The k·k candidates of the two codebooks always contain the k best of all N = S² slots."""
    g = torch.Generator().manual_seed(5)
    H, S, Dh, k = 3, 7, 4, 5
    keys = torch.randn(H, 2, S, Dh, generator=g, dtype=torch.float64)
    q = torch.randn(2, 9, H, 2 * Dh, generator=g, dtype=torch.float64)
    look, sub = product_key_lookup(q, keys, k, score)
    qh = q.view(2, 9, H, 2, 1, Dh)
    if score == "idw":
        s = -torch.log(IDW_EPS + ((qh - keys) ** 2).sum(-1))  # (2, 9, H, 2, S)
        assert sub.d2 is not None
    else:
        s = (qh * keys).sum(-1)
        assert sub.d2 is None
    every = (s[..., 0, :, None] + s[..., 1, None, :]).flatten(-2)  # (2, 9, H, S·S) slot a·S + b
    best = every.topk(k, dim=-1)
    assert torch.equal(look.idx, best.indices)
    torch.testing.assert_close(look.weights, best.values.softmax(-1))


def test_pkm_and_fwpkm_share_one_lookup():
    assert pkm.product_key_lookup is fwpkm.product_key_lookup is product_keys.product_key_lookup
    assert pkm.IDW_EPS is fwpkm.IDW_EPS is product_keys.IDW_EPS


def test_pkm_trains_with_mixed_adamw():
    torch.manual_seed(0)
    m = PKM(16, PKMConfig(num_subkeys=8, d_key=8, d_value=12, heads=2, topk=4))
    x = torch.randn(4, 6, 16)
    target = torch.randn(4, 6, 16)
    opt = MixedAdamW(
        [
            dict(params=[p for n, p in m.named_parameters() if n != "values.weight"]),
            dict(params=[m.values.weight], sparse=True, weight_decay=0.0),
        ],
        lr=1e-2,
        weight_decay=0.0,
    )
    losses = []
    for _ in range(20):
        loss = (m(x) - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("d_key", dict(d_key=7)),
        ("topk", dict(num_subkeys=4, topk=5)),
        ("score", dict(score="cosine")),
        ("heads", dict(heads=0)),
    ],
)
def test_config_validation_names_the_field(field, kwargs):
    with pytest.raises(ConfigError, match=rf"^PKMConfig\.{field}="):
        PKMConfig(**kwargs)
