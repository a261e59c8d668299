"""Decoding with the model's cache against one forward over the whole sequence, and sampling
against a greedy reference that re-reads the prefix; sampling leaves the model as it found it."""
import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.sample import sample

V = 61  # awkward vocabulary


def _model(mixer="swa", window=5, seed=0) -> FwPKMLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, n_layer=3, d_model=32, n_head=2, window=window, mixer=mixer,
                      fwpkm_layers=[1], fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4))
    model = FwPKMLM(cfg, rule=WriteRule(chunk=8))
    # Move the memory away from its initialisation, as an adapted one is.
    model(torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(seed + 1)))
    model.eval()
    model.set_writes(False)
    return model


@pytest.mark.parametrize("mixer", ["swa", "full"])
@pytest.mark.parametrize("pieces", [[1] * 37, [7, 1, 1, 13, 16], [37]])
def test_cached_decoding_equals_one_forward(mixer, pieces):
    model = _model(mixer)
    idx = torch.randint(0, V, (3, 37), generator=torch.Generator().manual_seed(2))  # T = 37 > 3 layers × window 5
    with torch.no_grad():
        whole = model(idx)
        cache, out, t = model.new_cache(), [], 0
        for n in pieces:
            out.append(model(idx[:, t:t + n], cache=cache))
            t += n
    assert torch.allclose(torch.cat(out, dim=1), whole, atol=1e-5, rtol=0), (torch.cat(out, 1) - whole).abs().max()
    assert cache[0].pos == 37
    assert cache[0].k.shape[2] == (4 if mixer == "swa" else 37)  # window − 1 kept, or everything


def test_the_cache_is_refused_where_it_would_be_wrong():
    model = _model()
    x = torch.zeros(1, 3, dtype=torch.long)
    model.set_writes(True)
    with pytest.raises(ValueError, match="writes off.*fwpkm1"):
        model(x, cache=model.new_cache())
    model.set_writes(False)
    model.train()
    with pytest.raises(RuntimeError, match="decoding cache is for evaluation"):
        model(x, cache=model.new_cache())
    with pytest.raises(ValueError, match="cache has 2 layers, the model 3"):
        model.eval()(x, cache=model.new_cache()[:2])


def _greedy_reference(model, n, length, start):
    """Argmax continuation, re-reading the whole prefix for every token."""
    rows = torch.full((n, 1), start, dtype=torch.long)
    with torch.no_grad():
        for _ in range(length):
            rows = torch.cat([rows, model(rows)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return rows


def test_cold_sampling_is_the_greedy_continuation():
    model = _model()
    rows = sample(model, 2, 30, generator=torch.Generator().manual_seed(0), temperature=1e-6, start=3)
    assert rows.shape == (2, 31) and rows.dtype == torch.long
    assert torch.equal(rows, _greedy_reference(model, 2, 30, start=3))


def test_samples_follow_the_models_distribution_and_its_memory():
    model = _model(window=50)
    first = torch.tensor([[3]])
    with torch.no_grad():
        p = torch.softmax(model(first)[0, -1], -1)
    rows = sample(model, 4000, 1, generator=torch.Generator().manual_seed(0), start=3, batch_size=1000)
    freq = torch.bincount(rows[:, 1], minlength=V).double() / 4000
    assert (freq - p.double()).abs().max() < 0.03  # 4000 draws: sd of a frequency ≤ 0.008
    # The draws read the fast memory: another memory, other texts.
    a = sample(model, 8, 20, generator=torch.Generator().manual_seed(5))
    for layer in model.fwpkm_layers():
        layer.reset(torch.Generator().manual_seed(9))
    b = sample(model, 8, 20, generator=torch.Generator().manual_seed(5))
    assert not torch.equal(a, b)


def test_sampling_leaves_no_trace_and_repeats_with_its_generator():
    model = _model()
    model.train()
    model.set_writes(True)
    layer = model.fwpkm_layers()[0]
    layer.read_counts += 7
    before = model.snapshot_memory()
    calls = (layer.calls, layer.writes)
    a = sample(model, 5, 12, generator=torch.Generator().manual_seed(1), batch_size=2)
    assert model.training and layer.writes_enabled and (layer.calls, layer.writes) == calls
    assert all(torch.equal(x, y) for s, t in zip(before, model.snapshot_memory()) for x, y in zip(s, t))
    assert torch.equal(a, sample(model, 5, 12, generator=torch.Generator().manual_seed(1), batch_size=5))
    assert not torch.equal(a, sample(model, 5, 12, generator=torch.Generator().manual_seed(2)))
    assert (a[:, 0] == 0).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n must be a positive int"), ({"length": 2.0}, "length must be a positive int"),
    ({"temperature": 0}, "temperature must be a number > 0"), ({"start": V}, "start token 61 is outside"),
])
def test_bad_arguments_are_named(kwargs, message):
    args = {"n": 1, "length": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        sample(_model(), generator=torch.Generator(), **args)
