"""Slot freezing: the slots chosen by hand-computed scores, the budget, frozen rows bit-identical
after later writes while still read, ownership per domain, and an exact resume."""
import math

import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import StrategyContext
from strategies import get_strategy
from strategies.slot_freezing import SlotFreezing


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=64, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2))  # 16 slots
    return FwPKMLM(cfg, WriteRule(chunk=8))


def end(strategy, model, t, domain, counts):
    layer = model.fwpkm_layers()[0]
    layer.read_counts.copy_(torch.tensor(counts))
    strategy.on_experience_end(StrategyContext(model=model, experience=t, domain=domain))


def frozen(model):
    return sorted((~model.fwpkm_layers()[0].write_mask).nonzero().flatten().tolist())


def test_usage_score_freezes_the_most_read_writable_slots():
    model = tiny_model()
    s = SlotFreezing(fraction=2 / 16, budget=5 / 16, score="usage")
    end(s, model, 1, "math", [0, 5, 9, 0, 1, 9, 0, 0, 2, 0, 0, 0, 0, 0, 0, 3])
    assert frozen(model) == [2, 5]  # 9 and 9: the tie goes to the lower id
    end(s, model, 2, "law", [0, 5, 9, 0, 1, 9, 0, 0, 2, 0, 0, 0, 0, 0, 0, 3])
    assert frozen(model) == [1, 2, 5, 15]  # frozen slots cannot be chosen again
    end(s, model, 3, "code", [7] * 16)
    assert frozen(model) == [0, 1, 2, 5, 15]  # the budget (5 slots) leaves room for one
    assert s.owned() == {"fwpkm1": {"math": 2, "law": 2, "code": 1}}


def test_tfidf_prefers_slots_the_background_did_not_use():
    model = tiny_model()
    s = SlotFreezing(fraction=1 / 16, budget=1.0, score="tfidf")
    end(s, model, 1, "math", [4, 4, 0, 0] + [0] * 12)      # no background: ranks by usage -> slot 0
    assert frozen(model) == [0]
    end(s, model, 2, "law", [0, 0, 0, 0] + [0] * 12 + [])  # reads nothing: freezes nothing
    assert frozen(model) == [0]
    counts = [0, 6, 5, 0] + [0] * 12
    end(s, model, 3, "code", counts)
    # background = math, law: df(1) = 1 (math read it), df(2) = 0
    tf1, tf2 = 6 / 11, 5 / 11
    idf1, idf2 = math.log(3 / 2) + 1, math.log(3 / 1) + 1
    assert tf2 * idf2 > tf1 * idf1 and frozen(model) == [0, 2]
    score = s.scores(torch.tensor(counts), [torch.tensor([4, 4] + [0] * 14), torch.zeros(16, dtype=torch.long)])
    assert score[1].item() == pytest.approx(tf1 * idf1) and score[2].item() == pytest.approx(tf2 * idf2)


def test_frozen_rows_stay_bit_identical_under_writes_and_are_still_read():
    model = tiny_model()
    model.eval()
    layer = model.fwpkm_layers()[0]
    x = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(x)
    s = get_strategy("slot_freezing", fraction=0.25, budget=0.5, score="usage")
    s.on_experience_end(StrategyContext(model=model, experience=1, domain="math"))
    ids = (~layer.write_mask).nonzero().flatten()
    assert len(ids) == 4
    before, all_before = layer.values[ids].clone(), layer.values.clone()
    layer.reset_read_counts()
    with torch.no_grad():
        for _ in range(3):
            model(x)
    assert torch.equal(layer.values[ids], before)
    assert bool((layer.read_counts[ids] > 0).all())  # the same inputs read them again
    changed = (layer.values != all_before).any(1)
    assert bool(changed.any()) and not bool(changed[ids].any())  # writes landed, only elsewhere


def test_resume_continues_exactly():
    a_model, b_model = tiny_model(), tiny_model()
    a = SlotFreezing(fraction=2 / 16, budget=0.5, score="tfidf")
    end(a, a_model, 1, "math", list(range(16)))
    b = SlotFreezing(fraction=2 / 16, budget=0.5, score="tfidf")
    b.load_state_dict(a.state_dict())
    b_model.fwpkm_layers()[0].write_mask.copy_(a_model.fwpkm_layers()[0].write_mask)  # saved with the model
    for s, m in ((a, a_model), (b, b_model)):
        end(s, m, 2, "law", list(reversed(range(16))))
    assert frozen(a_model) == frozen(b_model) and a.owned() == b.owned()
    with pytest.raises(ValueError, match="expected"):
        b.load_state_dict({"calls": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"fraction": 0}, "fraction"), ({"budget": 1.5}, "budget"), ({"score": "kl"}, "score"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SlotFreezing(**kwargs)


def test_a_model_without_fwpkm_is_an_error():
    cfg = ModelConfig(vocab_size=64, n_layer=1, d_model=32, n_head=2, window=8, fwpkm_layers=[])
    with pytest.raises(ValueError, match="no FwPKM layer"):
        SlotFreezing().on_experience_end(StrategyContext(model=FwPKMLM(cfg), experience=1, domain="math"))
