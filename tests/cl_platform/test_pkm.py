import pytest
import torch

from cl_platform.optim import MixedAdamW
from cl_platform.pkm import PKM, PKMConfig, pkm_reference

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
    q = torch.randn(1, 4, c.heads, 2, c.d_key // 2, dtype=torch.float64)
    scores, idx = m.lookup(q)
    assert idx.min() >= 0 and idx.max() < c.num_slots
    # recompute each picked slot's score from its two sub-keys: s = s¹_a + s²_b
    a, b = idx // c.num_subkeys, idx % c.num_subkeys
    for h in range(c.heads):
        d1 = ((q[0, :, h, 0, None, :] - m.keys[h, 0][a[0, :, h]]) ** 2).sum(-1)
        d2 = ((q[0, :, h, 1, None, :] - m.keys[h, 1][b[0, :, h]]) ** 2).sum(-1)
        expected = -torch.log(1e-3 + d1) - torch.log(1e-3 + d2)
        torch.testing.assert_close(scores[0, :, h], expected)
    assert (scores[..., :-1] >= scores[..., 1:]).all()  # sorted best first


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
    with pytest.raises(ValueError, match=f"PKMConfig.{field}"):
        PKMConfig(**kwargs)
