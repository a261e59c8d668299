"""LoRA in finetune mode: the engine's step (backward, after_backward, clip, the outer MixedAdamW
step) equals a naive LoRA that trains explicit factors through `functional_call`; only the
chosen matrices move, by a rank-r update; the state resumes bit for bit; bad input is refused."""
import copy

import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.optim import MixedAdamW
from cl_platform.strategy import StrategyContext
from strategies.lora import LoRA, target_matrices


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=16, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2))
    model = FwPKMLM(cfg, WriteRule(chunk=8))
    model.train()
    return model


def batches(n, B=2, T=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, 32, (B, T + 1), generator=g)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def engine_steps(model, strategy, data, outer_lr=1e-2):
    """The finetune step as `LMModule._gradient_step` takes it: loss, backward, after_backward,
    clip what is left, the outer optimiser's step over every slow weight."""
    ctx = StrategyContext(model=model, experience=1, domain="math", mode="finetune")
    strategy.on_experience_start(ctx)
    opt = MixedAdamW(model.optimizer_groups(0.1, outer_lr))
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        strategy.after_backward(ctx)
        dense = [p for p in model.parameters() if p.grad is not None]
        assert dense == []  # nothing left for the outer optimiser
        opt.step()
    return ctx


def test_the_engine_step_is_naive_lora_and_moves_only_the_chosen_matrices_by_rank_r():
    data = batches(4)
    model = tiny_model()
    slow = {n: p.detach().clone() for n, p in model.named_parameters()}
    s = LoRA(rank=2, params="mlp", lr=1e-2, grad_clip=1.0)
    engine_steps(model, s, data)

    # naive reference: explicit leaf factors, W₀ + B·A substituted into a copy of the model
    ref = tiny_model()
    names = sorted(target_matrices(ref, "mlp"))
    assert names == ["blocks.0.ffn.fc.weight", "blocks.0.ffn.proj.weight",
                     "blocks.1.ffn.fc.weight", "blocks.1.ffn.proj.weight"]
    g = torch.Generator().manual_seed(7)
    a, b = {}, {}
    for n, w in target_matrices(ref, "mlp").items():
        rows, cols = w.shape
        a[n] = ((torch.rand(2, cols, generator=g) * 2 - 1) / cols ** 0.5).requires_grad_(True)
        b[n] = torch.zeros(rows, 2, requires_grad=True)
    for p in ref.parameters():
        p.requires_grad_(False)
    factors = [t for n in names for t in (a[n], b[n])]
    opt = torch.optim.AdamW(factors, lr=1e-2, weight_decay=0.0)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        weights = {n: slow[n] + b[n] @ a[n] for n in names}
        _, loss = torch.func.functional_call(ref, weights, (x, y), strict=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(factors, 1.0)
        opt.step()
    for n in names:
        torch.testing.assert_close(s.a[n], a[n].detach(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(s.b[n], b[n].detach(), rtol=1e-5, atol=1e-7)
    for n, p in model.named_parameters():
        delta = (p - slow[n]).detach()
        if n in names:
            torch.testing.assert_close(p.detach(), slow[n] + (b[n] @ a[n]).detach(), rtol=1e-5, atol=1e-7)
            sv = torch.linalg.svdvals(delta.double())
            assert sv[1] > 1e-3 * sv[0] and bool((sv[2:] < 1e-5 * sv[0]).all()), (n, sv[:4])
        else:  # attention, embeddings, norms, the FwPKM projections: as pretrained
            assert torch.equal(p, slow[n]), n
    # the fast memory kept writing: both models read the same batches with the same weights
    for m_a, m_b in zip(model.snapshot_memory(), ref.snapshot_memory()):
        for t_a, t_b in zip(m_a, m_b):
            torch.testing.assert_close(t_a, t_b, rtol=1e-4, atol=1e-6)
    assert s.summary()["matrices"] == 4 and s.summary()["trainable_params"] == sum(t.numel() for t in factors)


def test_params_all_targets_every_matrix_and_leaves_vectors():
    model = tiny_model()
    targets = target_matrices(model, "all")
    assert "blocks.0.attn_norm.weight" not in targets
    assert all(p.ndim == 2 for p in targets.values())
    assert set(target_matrices(model, "mlp")) < set(targets)
    slow = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine_steps(model, LoRA(rank=1, params="all", lr=1e-2), batches(2))
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, slow[n])}
    assert moved == set(targets), (sorted(moved ^ set(targets)))


def test_a_resumed_strategy_continues_bit_for_bit():
    data = batches(4, seed=3)
    whole_model, whole = tiny_model(), LoRA(rank=3, lr=5e-3)
    engine_steps(whole_model, whole, data)
    model, first = tiny_model(), LoRA(rank=3, lr=5e-3)
    engine_steps(model, first, data[:2])
    state = copy.deepcopy(first.state_dict())
    second = LoRA(rank=3, lr=5e-3)
    second.load_state_dict(state)
    engine_steps(model, second, data[2:])  # on_experience_start keeps the loaded factors
    for n in whole.a:
        assert torch.equal(whole.a[n], second.a[n]) and torch.equal(whole.b[n], second.b[n])
    for p, q in zip(whole_model.parameters(), model.parameters()):
        assert torch.equal(p, q)


def test_bad_input_is_refused():
    for kwargs, match in [({"rank": 0}, "rank"), ({"rank": 2.0}, "rank"), ({"params": "pkm"}, "params"),
                          ({"lr": 0}, "lr"), ({"grad_clip": -1}, "grad_clip")]:
        with pytest.raises(ValueError, match=match):
            LoRA(**kwargs)
    model = tiny_model()
    with pytest.raises(ValueError, match="'fast' mode they are frozen"):
        LoRA().on_experience_start(StrategyContext(model=model, experience=1, domain="m", mode="fast"))
    with pytest.raises(ValueError, match="expected"):
        LoRA().load_state_dict({"a": {}})
