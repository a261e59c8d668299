"""Evaluation memory policies: the model is bit-identical after every session, with real forward passes."""
import dataclasses

import pytest
import torch

from cl_platform.memory.fwpkm import FastWeightState, FwPKMConfig, WriteRule
from cl_platform.memory_policy import POLICIES, FrozenMemory, ResetMemory, StreamMemory, get_memory_policy
from cl_platform.model import FwPKMLM, ModelConfig

V = 37


def _model() -> FwPKMLM:
    """Two FwPKM layers, short chunks, and a memory that has already been written and masked."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(
        ModelConfig.from_preset("small"), vocab_size=V, n_layer=2, d_model=32, n_head=2, window=8,
        fwpkm_layers=[0, 1], fwpkm=FwPKMConfig(num_subkeys=8, d_key=8, d_value=8, topk=4),
    )
    model = FwPKMLM(cfg, WriteRule(chunk=6)).eval()
    model.blocks[1].fwpkm.write_mask[::4] = False
    model.blocks[1].fwpkm.writes_enabled = False  # a strategy's setting, which a session must restore
    with torch.no_grad():
        model(_tokens(99))
    return model


def _tokens(seed: int, T: int = 20) -> torch.Tensor:
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(seed))


def _assert_same_memory(model: FwPKMLM, saved: list[FastWeightState]) -> None:
    for layer, snap in zip(model.fwpkm_layers(), saved, strict=True):
        for field in FastWeightState._fields:
            assert torch.equal(getattr(layer, field), getattr(snap, field)), (layer.name, field)


def _evaluate(model: FwPKMLM, policy: str, domains: dict[str, list[torch.Tensor]]) -> dict[str, list[torch.Tensor]]:
    session = get_memory_policy(policy).open(model)
    out = {}
    with torch.no_grad():
        for name, batches in domains.items():
            session.start_domain()
            out[name] = [model(idx) for idx in batches]
    session.close()
    return out


DOMAINS = {"a": [_tokens(1), _tokens(2)], "b": [_tokens(3)], "c": [_tokens(4), _tokens(5)]}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_part_of_the_model_is_bit_identical_after_a_session(policy):
    model = _model()
    memory = model.snapshot_memory()
    params = {name: p.detach().clone() for name, p in model.state_dict().items()}
    writes = [layer.writes_enabled for layer in model.fwpkm_layers()]
    assert writes == [True, False]

    _evaluate(model, policy, DOMAINS)

    _assert_same_memory(model, memory)
    assert [layer.writes_enabled for layer in model.fwpkm_layers()] == writes
    for name, value in model.state_dict().items():
        assert torch.equal(value, params[name]), name


def test_frozen_reads_without_writing_so_every_batch_sees_the_same_memory():
    model = _model()
    memory = model.snapshot_memory()
    session = FrozenMemory().open(model)
    assert not any(layer.writes_enabled for layer in model.fwpkm_layers())
    with torch.no_grad():
        session.start_domain()
        first = model(_tokens(1))
        model(_tokens(2))
        again = model(_tokens(1))
        for layer, snap in zip(model.fwpkm_layers(), memory):
            assert torch.equal(layer.keys, snap.keys) and torch.equal(layer.values, snap.values)
            assert not torch.equal(layer.read_counts, snap.read_counts)  # reads are counted, then undone
    session.close()
    assert torch.equal(first, again)
    _assert_same_memory(model, memory)


def test_stream_starts_each_domain_from_the_saved_memory():
    model = _model()
    together = _evaluate(model, "stream", DOMAINS)
    for name, batches in DOMAINS.items():  # each domain alone, from the model as it was
        alone = _evaluate(model, "stream", {name: batches})[name]
        for a, b in zip(together[name], alone, strict=True):
            assert torch.equal(a, b), name
    # within a domain the writes carry over: the second batch reads what the first wrote
    session = StreamMemory().open(model)
    assert all(layer.writes_enabled for layer in model.fwpkm_layers())
    with torch.no_grad():
        session.start_domain()
        model(_tokens(1))
        after_first = model(_tokens(2))
    session.close()
    assert torch.equal(after_first, together["a"][1])
    with torch.no_grad():
        assert not torch.equal(model(_tokens(2)), after_first)  # without the stream's first batch


def test_unknown_policy_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown evaluation memory policy 'keep'; allowed: \['frozen', 'reset', 'stream'\]"):
        get_memory_policy("keep")


def test_reset_reads_a_fresh_value_table_so_what_the_values_held_does_not_matter():
    model = _model()
    frozen = _evaluate(model, "frozen", DOMAINS)
    reset = _evaluate(model, "reset", DOMAINS)
    assert not torch.equal(frozen["a"][0], reset["a"][0])  # the values did carry something
    # Another memory with the same keys but other values: the control sees no difference ...
    other = _model()
    with torch.no_grad():
        for layer in other.fwpkm_layers():
            layer.values.mul_(-3.0)
    again = _evaluate(other, "reset", DOMAINS)
    assert all(torch.equal(a, b) for name in DOMAINS for a, b in zip(reset[name], again[name]))
    # ... and it is exactly `frozen` on the fresh table drawn from the documented seeds.
    fresh = _model()
    for i, layer in enumerate(fresh.fwpkm_layers()):
        layer.reset_slots(torch.arange(layer.values.shape[0]), torch.Generator().manual_seed(ResetMemory.SEED + i))
    by_hand = _evaluate(fresh, "frozen", DOMAINS)
    assert all(torch.equal(a, b) for name in DOMAINS for a, b in zip(reset[name], by_hand[name]))
