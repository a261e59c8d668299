"""Slot transfer: the slots chosen by hand-computed scores within the budget; the slow memory
reproduces the transferred read-outs; fast + slow read-outs equal the fast ones before the
transfer (the model's output does not move); later writes leave the slow memory alone; the fast
writes learn what the sum misses (`fwpkm_chunked(extra=...)` against a shifted target); resume."""
import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule, fwpkm_chunked, init_state
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import StrategyContext
from strategies import get_strategy
from strategies.slot_transfer import SlotTransfer, SlowMemory


def tiny_model(seed=0, heads=1):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=64, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2, heads=heads))  # 16 slots
    return FwPKMLM(cfg, WriteRule(chunk=8))


def tokens(seed=0, b=2, t=32):
    return torch.randint(0, 64, (b, t), generator=torch.Generator().manual_seed(seed))


def end(strategy, model, t, domain, counts=None):
    if counts is not None:
        model.fwpkm_layers()[0].read_counts.copy_(torch.tensor(counts))
    strategy.on_experience_end(StrategyContext(model=model, experience=t, domain=domain))


def logits(model, x):
    model.eval()
    model.set_writes(False)
    try:
        with torch.no_grad():
            return model(x)
    finally:
        model.set_writes(True)


def test_usage_score_picks_within_the_budget_and_reports_per_domain():
    model = tiny_model()
    s = SlotTransfer(fraction=2 / 16, budget=5 / 16, score="usage")
    end(s, model, 1, "math", [0, 5, 9, 0, 1, 9, 0, 0, 2, 0, 0, 0, 0, 0, 0, 3])
    end(s, model, 2, "law", [0, 5, 9, 0, 1, 9, 0, 0, 2, 0, 0, 0, 0, 0, 0, 3])  # a slot may go again
    end(s, model, 3, "code", [7] * 16)
    banks = s.banks["fwpkm1"]
    assert [b["ids"].tolist() for b in banks] == [[2, 5], [2, 5], [0]]  # ties: lower id; budget 5
    assert s.transferred() == {"fwpkm1": {"math": 2, "law": 2, "code": 1}}
    assert s.summary()["banks_per_layer"] == {"fwpkm1": 3}


@pytest.mark.parametrize("heads", [1, 2])
def test_the_model_reads_the_same_right_after_a_transfer(heads):
    model = tiny_model(heads=heads)
    x = tokens()
    model.eval()
    with torch.no_grad():
        model(x)  # write something, and count the reads
    layer = model.fwpkm_layers()[0]
    before_values = layer.values.clone()
    before = logits(model, x)
    s = get_strategy("slot_transfer", fraction=0.5, budget=1.0, score="tfidf")
    end(s, model, 1, "math")
    ids = s.banks["fwpkm1"][0]["ids"]
    assert len(ids) == 8
    assert torch.equal(layer.values[ids], torch.zeros(8, 8))  # freed
    assert torch.equal(s.banks["fwpkm1"][0]["table"], before_values[ids])  # copied
    assert isinstance(layer.extra_read, SlowMemory)
    after = logits(model, x)
    assert torch.allclose(after, before, atol=1e-5, rtol=0), (after - before).abs().max()
    # Without the slow memory the model has lost what it held: the transfer is what keeps it.
    layer.extra_read = None
    assert (logits(model, x) - before).abs().max() > 1e-3


def test_the_slow_memory_reproduces_the_transferred_read_outs():
    model = tiny_model(heads=2)
    layer = model.fwpkm_layers()[0]
    q = torch.randn(3, 10, layer.config.d_key * layer.config.heads, generator=torch.Generator().manual_seed(1))
    v, g = torch.zeros(3, 10, 8), torch.ones(3, 10)
    fast_before = fwpkm_chunked(q, v, g, layer.snapshot(), layer.config, layer.rule, write=False).vhat
    s = SlotTransfer(fraction=1.0, budget=1.0, score="usage")
    end(s, model, 1, "math", [1] * 16)  # every slot goes
    assert torch.allclose(layer.extra_read(q), fast_before, atol=1e-6, rtol=0)
    fast_after = fwpkm_chunked(q, v, g, layer.snapshot(), layer.config, layer.rule, write=False).vhat
    assert torch.equal(fast_after, torch.zeros_like(fast_after))


def test_later_writes_leave_the_slow_memory_and_the_banks_add_up():
    model = tiny_model()
    layer = model.fwpkm_layers()[0]
    x1, x2 = tokens(0), tokens(1)
    model.eval()
    s = SlotTransfer(fraction=0.25, budget=1.0, score="usage")
    with torch.no_grad():
        model(x1)
    end(s, model, 1, "math")
    bank1 = {k: v.clone() for k, v in s.banks["fwpkm1"][0].items() if torch.is_tensor(v)}
    layer.reset_read_counts()
    with torch.no_grad():
        model(x2)
        model(x2)
    for k, v in bank1.items():
        assert torch.equal(s.banks["fwpkm1"][0][k], v)  # writes went to the fast memory only
    assert not torch.equal(layer.values, torch.zeros_like(layer.values))
    end(s, model, 2, "law")
    assert len(s.banks["fwpkm1"]) == 2
    q = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    one = [SlowMemory([b], 16, 2)(q) for b in s.banks["fwpkm1"]]
    assert torch.allclose(layer.extra_read(q), one[0] + one[1], atol=1e-6, rtol=0)


def _write_inputs():
    """A small layer config, a write rule, and q, v, g and another memory's read-out E for 2 × 12 tokens."""
    gen = torch.Generator().manual_seed(3)
    q, v = torch.randn(2, 12, 8, generator=gen), torch.randn(2, 12, 8, generator=gen)
    g, extra = torch.rand(2, 12, generator=gen), torch.randn(2, 12, 8, generator=gen)
    return FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2), WriteRule(chunk=4, lr_values=0.5), q, v, g, extra


def test_fast_writes_learn_what_the_sum_misses():
    # With another memory's read-out E added, the fast memory writes as if its target were
    # v_{t+1} - E_t (look-ahead): it learns the residual, and reads out its own + E.
    cfg, rule, q, v, g, extra = _write_inputs()

    a, b = init_state(cfg, torch.Generator().manual_seed(4)), init_state(cfg, torch.Generator().manual_seed(4))
    out_a = fwpkm_chunked(q, v, g, a, cfg, rule, extra=extra)
    shifted = v.clone()
    shifted[:, 1:] = v[:, 1:] - extra[:, :-1]
    out_b = fwpkm_chunked(q, shifted, g, b, cfg, rule)
    assert torch.allclose(a.values, b.values, atol=1e-6, rtol=0) and torch.allclose(a.keys, b.keys, atol=1e-6, rtol=0)
    assert torch.allclose(out_a.vhat, out_b.vhat + extra, atol=1e-6, rtol=0)
    assert not torch.allclose(a.values, init_state(cfg, torch.Generator().manual_seed(4)).values)


def test_uncorrected_fast_writes_ignore_the_other_memory_which_stays_in_the_read():
    # correct_extra=False: the writes are those of the fast memory alone (the same state as a call
    # without E), and the read-out is still its own + E.
    cfg, rule, q, v, g, extra = _write_inputs()

    a, b, c = (init_state(cfg, torch.Generator().manual_seed(4)) for _ in range(3))
    out_a = fwpkm_chunked(q, v, g, a, cfg, rule, extra=extra, correct_extra=False)
    out_b = fwpkm_chunked(q, v, g, b, cfg, rule)
    fwpkm_chunked(q, v, g, c, cfg, rule, extra=extra)
    assert torch.equal(a.values, b.values) and torch.equal(a.keys, b.keys)
    assert torch.allclose(out_a.vhat, out_b.vhat + extra, atol=1e-6, rtol=0)
    assert not torch.allclose(a.values, c.values)  # the corrected writes differ: the knob acts


@pytest.mark.parametrize("correct", [True, False])
def test_the_strategy_sets_the_layers_write_rule_for_the_slow_memory(correct):
    model = tiny_model()
    model.eval()
    with torch.no_grad():
        model(tokens())
    s = SlotTransfer(fraction=0.25, budget=0.5, correct=correct)
    end(s, model, 1, "math")
    layer = model.fwpkm_layers()[0]
    assert isinstance(layer.extra_read, SlowMemory) and layer.extra_corrected is correct


def test_resume_reattaches_the_same_slow_memory():
    a_model, b_model = tiny_model(), tiny_model()
    x = tokens()
    for m in (a_model, b_model):
        m.eval()
        with torch.no_grad():
            m(x)
    a = SlotTransfer(fraction=0.25, budget=0.5)
    end(a, a_model, 1, "math")
    b = SlotTransfer(fraction=0.25, budget=0.5)
    b.load_state_dict(a.state_dict())
    b_model.load_state_dict(a_model.state_dict())  # the freed rows travel with the model
    assert b_model.fwpkm_layers()[0].extra_read is None
    ctx = StrategyContext(model=b_model, experience=2, domain="law")
    assert b.transform_batch("batch", ctx) == "batch"  # the first hook after a resume attaches
    assert torch.equal(logits(a_model, x), logits(b_model, x))
    for s, m in ((a, a_model), (b, b_model)):
        end(s, m, 2, "law", list(reversed(range(16))))
    assert a.transferred() == b.transferred() and torch.equal(logits(a_model, x), logits(b_model, x))
    with pytest.raises(ValueError, match="expected"):
        b.load_state_dict({"calls": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"fraction": 0}, "fraction"), ({"budget": 1.5}, "budget"), ({"score": "kl"}, "score"),
    ({"correct": "no"}, "correct must be true or false"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SlotTransfer(**kwargs)


def test_a_model_without_fwpkm_is_an_error():
    cfg = ModelConfig(vocab_size=64, n_layer=1, d_model=32, n_head=2, window=8, fwpkm_layers=[])
    with pytest.raises(ValueError, match="no FwPKM layer"):
        SlotTransfer().on_experience_start(StrategyContext(model=FwPKMLM(cfg), experience=1, domain="math"))
