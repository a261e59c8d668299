"""Fast-to-slow distillation: the KL falls, only the chosen slow weights move, the memory ends as
`after` says, frozen flags come back, fast mode only, and the state resumes exactly."""
from types import SimpleNamespace

import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import StrategyContext
from strategies.distill import Distill


def setup(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4))
    model = FwPKMLM(cfg, WriteRule(chunk=8, lr_values=1.0))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)  # fast mode
    g = torch.Generator().manual_seed(1)
    segs = []
    for _ in range(6):
        x = torch.randint(0, 32, (17,), generator=g)
        segs.append({"input_ids": x[:-1], "targets": x[1:]})
    return model, segs


def adapt(model, segs):
    with torch.no_grad():
        for s in segs:
            model(s["input_ids"][None])


@pytest.mark.parametrize("after", ["keep", "reset"])
def test_kl_falls_only_mlps_move_and_memory_ends_as_asked(after):
    model, segs = setup()
    s = Distill(params="mlp", steps=25, batch_size=3, lr=3e-3, after=after)
    ctx = StrategyContext(model=model, experience=1, domain="math", mode="fast",
                          current=SimpleNamespace(data=SimpleNamespace(segments=segs)))
    s.on_experience_start(ctx)
    before = model.snapshot_memory()
    adapt(model, segs)
    adapted = model.snapshot_memory()
    slow = {n: p.clone() for n, p in model.named_parameters()}
    s.on_experience_end(ctx)
    losses = s.losses[-1]
    assert len(losses) == 25 and losses[0] > 0 and losses[-1] < 0.7 * losses[0], losses
    for n, p in model.named_parameters():
        moved = not torch.equal(p, slow[n])
        assert moved == (".ffn." in n and "blocks" in n), n
        assert not p.requires_grad and p.grad is None
    want = adapted if after == "keep" else before
    for a, b in zip(model.snapshot_memory(), want):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(layer.writes_enabled for layer in model.fwpkm_layers())


def test_finetune_mode_and_no_memory_are_refused():
    model, _ = setup()
    with pytest.raises(ValueError, match="'fast' mode only"):
        Distill().on_experience_start(StrategyContext(model=model, experience=1, domain="m", mode="finetune"))
    cfg = ModelConfig(vocab_size=32, n_layer=1, d_model=32, n_head=2, window=8, fwpkm_layers=[])
    with pytest.raises(ValueError, match="no FwPKM layer"):
        Distill().on_experience_start(StrategyContext(model=FwPKMLM(cfg), experience=1, domain="m", mode="fast"))
    with pytest.raises(ValueError, match="params"):
        Distill(params="attention")


def test_resume_mid_experience_consolidates_the_same_way():
    runs = []
    for resumed in (False, True):
        model, segs = setup()
        s = Distill(steps=5, batch_size=2)
        ctx = StrategyContext(model=model, experience=1, domain="math", mode="fast",
                              current=SimpleNamespace(data=SimpleNamespace(segments=segs)))
        s.on_experience_start(ctx)
        adapt(model, segs[:3])
        if resumed:
            s2 = Distill(steps=5, batch_size=2)
            s2.load_state_dict(s.state_dict())
            s = s2
        adapt(model, segs[3:])
        s.on_experience_end(ctx)
        runs.append((s.losses, [p.clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
