"""The FwPKM core never waits for the device: no op that reads a tensor on the host or makes a
shape depend on data, except the one check at the end of a call; it compiles as one graph; a
non-finite write is still reported with its chunk, the memory as it was before that chunk."""
from __future__ import annotations

import pytest
import torch

from cl_platform.memory.fwpkm import (
    FastWeightState,
    FwPKM,
    FwPKMConfig,
    NonFiniteWriteError,
    WriteRule,
    fwpkm_chunked,
    fwpkm_core,
    init_state,
    padded_unique,
    zscore,
)
from cl_platform.memory.sync_audit import SyncAudit

CFG = FwPKMConfig(num_subkeys=16, d_key=16, d_value=8, topk=4)
CHUNK = 8


def toy_case(chunks: int, seed: int = 0, frozen: bool = True):
    """q, v, g of `chunks` chunks of 8 tokens (B = 2) and a fresh state, every third row frozen."""
    gen = torch.Generator().manual_seed(seed)
    T = CHUNK * chunks
    q = torch.randn(2, T, CFG.d_key, generator=gen)
    v = zscore(torch.randn(2, T, CFG.d_value, generator=gen))
    g = torch.rand(2, T, generator=gen)
    state = init_state(CFG, torch.Generator().manual_seed(seed + 1))
    if frozen:
        state.write_mask[::3] = False
    return q, v, g, state


def copy(state: FastWeightState) -> FastWeightState:
    return FastWeightState(*(t.clone() for t in state))


def audited_call(chunks: int, write: bool, graph: bool, fn=fwpkm_chunked) -> SyncAudit:
    q, v, g, state = toy_case(chunks)
    q.requires_grad_(graph)
    with torch.set_grad_enabled(graph), SyncAudit() as audit:
        out = fn(q, v, g, state, CFG, WriteRule(chunk=CHUNK), write=write)
        if graph:
            (out.vhat.pow(2).sum() + out.addr_loss.sum()).backward()
    return audit


@pytest.mark.parametrize("graph", [False, True], ids=["no-graph", "training"])
@pytest.mark.parametrize("write", [True, False], ids=["write", "read-only"])
def test_no_host_reads_per_chunk_and_at_most_one_per_call(write, graph):
    """Old code: 4 per chunk without a graph (unique, three bool() checks), 2 more with frozen rows
    (boolean indexing), plus a unique per overlay merge in training."""
    short, long = audited_call(2, write, graph), audited_call(6, write, graph)
    assert long.counts == short.counts, "an op that waits for the device runs per chunk"
    assert long.total == (1 if write else 0), long.counts  # the end-of-call check, only when writing
    assert long.counts["_local_scalar_dense"] == long.total


@pytest.mark.parametrize("graph", [False, True], ids=["no-graph", "training"])
def test_the_core_never_reads_the_device(graph):
    assert audited_call(6, True, graph, fn=fwpkm_core).total == 0


def test_module_training_step_reads_the_device_once():
    torch.manual_seed(0)
    layer = FwPKM(16, CFG, WriteRule(chunk=CHUNK))
    layer.write_mask[::3] = False
    x = torch.randn(2, 5 * CHUNK, 16, requires_grad=True)
    with SyncAudit() as audit:
        layer(x).pow(2).mean().backward()
    assert audit.total == 1, audit.counts


def test_padded_unique_is_unique_padded_with_the_sentinel():
    for P, n in ((1, 5), (2, 3), (40, 7), (40, 1000)):
        flat = torch.randint(0, n, (P,), generator=torch.Generator().manual_seed(P + n))
        slots = padded_unique(flat, n)
        ids, inv, counts = torch.unique(flat, return_inverse=True, return_counts=True)
        U = ids.numel()
        assert slots.ids.shape == slots.inv.shape == slots.counts.shape == (P,)
        assert torch.equal(slots.ids[:U], ids) and bool((slots.ids[U:] == n).all())
        assert torch.equal(slots.inv, inv)
        assert torch.equal(slots.counts[:U], counts) and int(slots.counts[U:].abs().sum()) == 0


# --- one graph ---------------------------------------------------------------------------------


def compiled_and_eager(backend: str, graph: bool):
    """The core on the same inputs, eager and under `torch.compile(fullgraph=True)` (which raises
    on any graph break): outputs, final states and (training) the gradients of q, v, g."""
    results = []
    for fn in (fwpkm_core, torch.compile(fwpkm_core, fullgraph=True, backend=backend)):
        q, v, g, state = toy_case(3, seed=3)
        for t in (q, v, g):
            t.requires_grad_(graph)
        with torch.set_grad_enabled(graph):
            out = fn(q, v, g, state, CFG, WriteRule(chunk=CHUNK))
            grads = None
            if graph:
                w = torch.linspace(-1, 1, out.vhat.numel()).view_as(out.vhat)
                grads = torch.autograd.grad((out.vhat * w).sum() + out.addr_loss.sum(), (q, v, g))
        results.append((out, state, grads))
    torch._dynamo.reset()
    return results


@pytest.mark.parametrize("graph", [False, True], ids=["no-graph", "training"])
def test_core_compiles_as_one_graph_equal_to_eager(graph):
    (a, sa, _), (b, sb, _) = compiled_and_eager("eager", graph)
    for name, x, y in zip(a._fields, a, b):
        for xx, yy in zip(x, y) if name == "lookup" else [(x, y)]:
            assert torch.equal(xx, yy), name
    for name, x, y in zip(sa._fields, sa, sb):
        assert torch.equal(x, y), name
    assert int(a.fault) == -1


@pytest.mark.parametrize("graph", [False, True], ids=["no-graph", "training"])
def test_core_traces_through_aot_autograd(graph):
    (a, sa, ga), (b, sb, gb) = compiled_and_eager("aot_eager", graph)
    assert torch.equal(a.lookup.idx, b.lookup.idx)
    torch.testing.assert_close(b.vhat, a.vhat, atol=1e-6, rtol=1e-6)
    for name, x, y in zip(sa._fields, sa, sb):
        torch.testing.assert_close(y, x, atol=1e-6, rtol=1e-6, msg=name)
    if graph:
        for name, x, y in zip("qvg", ga, gb):
            torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4, msg=f"gradient of {name}")  # float32 reassociation


# --- non-finite writes -------------------------------------------------------------------------


@pytest.mark.parametrize("graph", [False, True], ids=["no-graph", "training"])
def test_non_finite_write_in_a_later_chunk_names_it_and_leaves_the_memory_from_it_on(graph):
    q, v, g, start = toy_case(4, seed=5)
    v[:, CHUNK + 3] = float("nan")  # a look-ahead target of chunk 1
    rule = WriteRule(chunk=CHUNK)
    state = copy(start)
    with pytest.raises(NonFiniteWriteError, match=r"toy: non-finite value write in chunk 1;"):
        fwpkm_chunked(q.requires_grad_(graph), v, g, state, CFG, rule, name="toy")
    # Without a graph chunk 0 has landed; with one the writes land together, so none has. The
    # reads of the failed chunk are counted, later ones not.
    expected = copy(start)
    with torch.no_grad():
        fwpkm_chunked(q[:, :CHUNK], v[:, :CHUNK], g[:, :CHUNK], expected, CFG, rule)
    if graph:
        expected = expected._replace(keys=start.keys, values=start.values)
    assert torch.equal(state.values, expected.values) and torch.equal(state.keys, expected.keys)
    counted = copy(start)
    with torch.no_grad():
        fwpkm_chunked(q[:, : 2 * CHUNK].detach(), v[:, : 2 * CHUNK].nan_to_num(), g[:, : 2 * CHUNK], counted, CFG, rule)
    assert torch.equal(state.read_counts, counted.read_counts)


def test_the_core_reports_the_fault_instead_of_raising():
    q, v, g, state = toy_case(4, seed=5)
    v[:, 2 * CHUNK + 1 :] = float("inf")
    out = fwpkm_core(q, v, g, state, CFG, WriteRule(chunk=CHUNK))
    assert int(out.fault) == 2 * 2  # chunk 2, the values


def test_a_non_finite_write_to_frozen_rows_only_is_dropped_not_raised():
    """As before: frozen rows never change, so what would have been written to them is not checked."""
    q, v, g, state = toy_case(3, seed=7, frozen=False)
    state.write_mask[:] = False
    v[:, 3] = float("nan")
    before = copy(state)
    out = fwpkm_chunked(q, v, g, state, CFG, WriteRule(chunk=CHUNK))
    assert torch.equal(state.values, before.values)
    assert not torch.equal(state.keys, before.keys)  # the keys are written as usual
    assert int(out.fault) == -1 and float(out.value_update_norm) == 0.0
