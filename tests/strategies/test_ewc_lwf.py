"""EWC and LwF: the penalty against a hand computation, the Fisher against per-batch gradients,
the per-token KL against its definition, the distillation loss falling as the student learns,
`fast` mode refused, and exact resume."""
import copy

import pytest
import torch
import torch.nn.functional as F

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import StrategyContext
from strategies.ewc import EWC, _dense_params
from strategies.lwf import LwF, token_kl


def tiny_model(seed=0, pkm=False):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=16, n_head=2, window=8, fwpkm_layers=[1],
                      pkm_layers=[0] if pkm else [], fwpkm=FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2))
    return FwPKMLM(cfg, WriteRule(chunk=8))


def batches(n=3, B=2, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, 32, (B, T + 1), generator=g)
        out.append({"input_ids": x[:, :-1], "targets": x[:, 1:]})
    return out


def test_fisher_is_the_mean_squared_batch_gradient_and_leaves_the_memory_alone():
    model = tiny_model(pkm=True)
    memory = model.snapshot_memory()
    data = batches()
    fisher = EWC().fisher_of(model, data)
    params = _dense_params(model)
    assert "blocks.0.ffn.values.weight" not in params  # the static PKM's sparse rows are left out
    want = {n: torch.zeros_like(p) for n, p in params.items()}
    for b in data:
        m = copy.deepcopy(model)
        m.eval()
        m.restore_memory(memory)
        _, loss = m(b["input_ids"], b["targets"])
        grads = torch.autograd.grad(loss, [dict(m.named_parameters())[n] for n in params], allow_unused=True)
        for n, g in zip(params, grads):
            if g is not None:
                want[n] += g ** 2
    for n in params:
        torch.testing.assert_close(fisher[n], want[n] / len(data))
    for a, b in zip(model.snapshot_memory(), memory):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_ewc_penalty_equals_the_hand_computed_value():
    model = tiny_model()
    s = EWC(lam=3.0, decay=0.5)
    s.consolidate(model, batches(2))
    first = {k: v.clone() for k, v in s.fisher.items()}
    assert float(s.penalty(model).detach()) == 0.0  # at the anchor
    params = _dense_params(model)
    with torch.no_grad():
        for p in params.values():
            p.add_(0.1)
    want = 0.5 * 3.0 * sum(float((first[n] * 0.01).sum()) for n in params)
    assert float(s.penalty(model)) == pytest.approx(want, rel=1e-5)
    ctx = StrategyContext(model=model, experience=2, domain="law", mode="finetune")
    loss = s.extra_losses({}, {}, ctx)["ewc/penalty"]
    loss.backward()  # the gradient is lam · F · (θ − θ*)
    name = next(iter(params))
    torch.testing.assert_close(params[name].grad, 3.0 * first[name] * 0.1)
    s.consolidate(model, batches(2, seed=1))  # online: F ← 0.5 F + F_new
    new = EWC().fisher_of(model, batches(2, seed=1))
    torch.testing.assert_close(s.fisher[name], 0.5 * first[name] + new[name])


def test_token_kl_matches_its_definition_and_is_zero_for_the_same_logits():
    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    targets = torch.tensor([[1, 2, -100], [0, -100, 4]])
    T = 2.0
    want = []
    for b in range(2):
        for i in range(3):
            if targets[b, i] != -100:
                p, q = F.softmax(t[b, i] / T, -1), F.softmax(s[b, i] / T, -1)
                want.append(float((p * (p / q).log()).sum()))
    assert float(token_kl(t, s, targets, T)) == pytest.approx(T * T * sum(want) / len(want), rel=1e-5)
    assert float(token_kl(t, t, targets, T)) == pytest.approx(0.0, abs=1e-7)


def test_lwf_loss_falls_as_the_student_follows_the_teacher():
    model = tiny_model()
    s = LwF(alpha=1.0, temperature=2.0)
    ctx = StrategyContext(model=model, experience=2, domain="law", mode="finetune")
    s.on_experience_start(ctx)
    b = batches(1)[0]
    with torch.no_grad():
        model.lm_head.weight.add_(0.5 * torch.randn_like(model.lm_head.weight))  # the student drifts away
    model.set_writes(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(15):
        logits = model(b["input_ids"])
        loss = s.extra_losses(b, {"logits": logits}, ctx)["lwf/kl"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[0] > 0.01 and losses[-1] < 0.5 * losses[0]
    assert all(not p.requires_grad for p in s.teacher.parameters())


def test_lwf_resume_rebuilds_the_same_teacher():
    model = tiny_model()
    a = LwF()
    ctx = StrategyContext(model=model, experience=2, domain="law", mode="finetune")
    a.on_experience_start(ctx)
    b = LwF()
    b.load_state_dict(a.state_dict())
    other = tiny_model(seed=5)  # the resumed run's model has moved on; the teacher must not
    batch = batches(1)[0]
    logits = other(batch["input_ids"])
    ctx_b = StrategyContext(model=other, experience=2, domain="law", mode="finetune")
    assert float(b.extra_losses(batch, {"logits": logits}, ctx_b)["lwf/kl"]) == pytest.approx(
        float(a.extra_losses(batch, {"logits": logits}, ctx_b)["lwf/kl"]), rel=1e-6)
    assert LwF().extra_losses(batch, {"logits": logits}, ctx) == {}  # no teacher before experience 2


@pytest.mark.parametrize("cls", [EWC, LwF])
def test_fast_mode_is_refused(cls):
    with pytest.raises(ValueError, match="'fast' mode"):
        cls().on_experience_start(StrategyContext(model=tiny_model(), experience=1, domain="math", mode="fast"))


def test_ewc_state_round_trip():
    model = tiny_model()
    a = EWC(lam=2.0)
    a.consolidate(model, batches(1))
    b = EWC(lam=2.0)
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        for p in _dense_params(model).values():
            p.mul_(1.1)
    assert float(a.penalty(model)) == float(b.penalty(model)) > 0
    with pytest.raises(ValueError, match="expected"):
        b.load_state_dict({"teacher": None})
