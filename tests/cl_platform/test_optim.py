import pytest
import torch
from torch import nn

from cl_platform.optim import MixedAdamW


def _dense_grads(shapes, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_dense_group_matches_torch_adamw(weight_decay):
    shapes = [(7, 5), (5,), (3, 4, 2)]
    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [nn.Parameter(p.detach().clone()) for p in ours]
    init = [p.detach().clone() for p in ours]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    opt = MixedAdamW(ours, **kw)
    opt_ref = torch.optim.AdamW(ref, **kw)
    for grads in _dense_grads(shapes, steps=6):
        for p, q, g in zip(ours, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        opt_ref.step()
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)
    assert all(not torch.allclose(p, p0) for p, p0 in zip(ours, init))


def _embedding_pair(n, d, seed=0):
    torch.manual_seed(seed)
    a = nn.Embedding(n, d, sparse=True)
    b = nn.Embedding(n, d, sparse=True)
    b.weight.data.copy_(a.weight.data)
    return a, b


def test_sparse_group_matches_sparse_adam():
    ours, ref = _embedding_pair(11, 4)
    kw = dict(lr=5e-2, betas=(0.8, 0.99), eps=1e-8)
    opt = MixedAdamW([dict(params=ours.parameters(), sparse=True, weight_decay=0.0)], **kw)
    opt_ref = torch.optim.SparseAdam(ref.parameters(), **kw)
    g = torch.Generator().manual_seed(1)
    untouched = torch.tensor([10])  # never read: must not move
    for _ in range(5):
        # repeated indices give an uncoalesced gradient, as an embedding-bag read does
        idx = torch.randint(0, 10, (9,), generator=g)
        w = torch.randn(9, 4, generator=g)
        for emb in (ours, ref):
            emb.weight.grad = None
            (emb(idx) * w).sum().backward()
        assert ours.weight.grad.is_sparse
        opt.step()
        opt_ref.step()
    torch.testing.assert_close(ours.weight, ref.weight, atol=1e-6, rtol=1e-6)
    init, _ = _embedding_pair(11, 4)
    torch.testing.assert_close(ours.weight[untouched], init.weight[untouched])


def test_mixed_groups_in_one_optimizer_and_state_dict_resume():
    def build():
        torch.manual_seed(0)
        emb, lin = nn.Embedding(6, 3, sparse=True), nn.Linear(3, 2)
        opt = MixedAdamW(
            [
                dict(params=[lin.weight], weight_decay=0.1),
                dict(params=[lin.bias], weight_decay=0.0),
                dict(params=[emb.weight], sparse=True, weight_decay=0.0),
            ],
            lr=1e-2,
        )
        return emb, lin, opt

    def step(emb, lin, opt, i):
        opt.zero_grad(set_to_none=True)
        idx = torch.tensor([i % 6, (i + 2) % 6, i % 6])
        lin(emb(idx)).pow(2).sum().backward()
        opt.step()

    emb, lin, opt = build()
    for i in range(4):
        step(emb, lin, opt, i)
    emb2, lin2, opt2 = build()
    for i in range(2):
        step(emb2, lin2, opt2, i)
    saved = (emb2.state_dict(), lin2.state_dict(), opt2.state_dict())
    emb3, lin3, opt3 = build()
    emb3.load_state_dict(saved[0])
    lin3.load_state_dict(saved[1])
    opt3.load_state_dict(saved[2])
    for i in range(2, 4):
        step(emb3, lin3, opt3, i)
    torch.testing.assert_close(emb3.weight, emb.weight)
    torch.testing.assert_close(lin3.weight, lin.weight)


def test_sparse_group_with_weight_decay_is_refused():
    emb = nn.Embedding(4, 2, sparse=True)
    with pytest.raises(ValueError, match="weight_decay"):
        MixedAdamW([dict(params=emb.parameters(), sparse=True, name="pkm_values")], weight_decay=0.1)


def test_gradient_kind_must_match_group():
    emb = nn.Embedding(4, 2, sparse=True)
    opt = MixedAdamW([dict(params=emb.parameters(), name="oops")], sparse=False)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="'oops'.*sparse gradient"):
        opt.step()


def _per_tensor_adamw(p, grad, state, lr, betas, eps, weight_decay):
    """The dense update one tensor at a time (the loop MixedAdamW ran before its multi-tensor
    step), the reference the multi-tensor step must equal bit for bit on the CPU."""
    import math

    beta1, beta2 = betas
    state["step"] += 1
    p.mul_(1 - lr * weight_decay)
    state["m"].lerp_(grad, 1 - beta1)
    state["v"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (state["v"].sqrt() / math.sqrt(1 - beta2 ** state["step"])).add_(eps)
    p.addcdiv_(state["m"], denom, value=-lr / (1 - beta1 ** state["step"]))


def test_multi_tensor_step_is_the_per_tensor_loop_bit_for_bit_with_per_parameter_steps():
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    torch.manual_seed(3)
    ours = [nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [p.detach().clone() for p in ours]
    states = [dict(step=0, m=torch.zeros(s), v=torch.zeros(s)) for s in shapes]
    kw = dict(lr=3e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = MixedAdamW(ours, **kw)
    for t, grads in enumerate(_dense_grads(shapes, steps=7, seed=2)):
        for i, (p, q, g, st) in enumerate(zip(ours, ref, grads, states)):
            skip = i == 1 and t % 3 == 0  # a parameter without a gradient this step: its step count lags
            p.grad = None if skip else g.clone()
            if not skip:
                _per_tensor_adamw(q, g, st, **kw)
        opt.step()
    for p, q in zip(ours, ref):
        assert torch.equal(p.detach(), q)
    assert opt.state[ours[1]]["step"] == states[1]["step"] == 4 and opt.state[ours[0]]["step"] == 7
