"""Data-parallel writes: every rank ends with the memory one process would write from the whole batch."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule

WORLD = 2


def make_layer_and_batch():
    torch.manual_seed(0)
    cfg = FwPKMConfig(num_subkeys=8, d_key=8, d_value=6, topk=4)
    layer = FwPKM(16, cfg, WriteRule(chunk=5)).double()
    x = torch.randn(2 * WORLD, 17, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return layer, x


def run_steps(layer, x):
    """Two calls: one differentiable (training through the writes), one without a graph."""
    layer(x.clone().requires_grad_(True)).pow(2).mean().backward()
    with torch.no_grad():
        layer(x.flip(1))


def worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        layer, x = make_layer_and_batch()
        run_steps(layer, x[2 * rank : 2 * rank + 2])
        torch.save({k: v for k, v in layer.state_dict().items() if k in ("keys", "values", "read_counts")},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_hold_identical_memory_equal_to_single_process(tmp_path):
    mp.spawn(worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD))
    for key in ("keys", "values", "read_counts"):
        assert torch.equal(r0[key], r1[key]), key

    layer, x = make_layer_and_batch()
    start = layer.snapshot()
    run_steps(layer, x)
    assert not torch.equal(layer.values, start.values)
    torch.testing.assert_close(r0["values"], layer.values, atol=1e-12, rtol=0)
    torch.testing.assert_close(r0["keys"], layer.keys, atol=1e-12, rtol=0)
    assert torch.equal(r0["read_counts"], layer.read_counts)


def grad_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        layer, x = make_layer_and_batch()
        shard = x[2 * rank : 2 * rank + 2].clone().requires_grad_(True)
        layer(shard).pow(2).sum().backward()  # this rank's share of the global loss Σ_r L_r
        grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
        torch.save({"params": grads, "input": shard.grad}, os.path.join(out_dir, f"grad{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gradients_summed_over_ranks_equal_one_process_on_the_whole_batch(tmp_path):
    """What DDP averages (each rank's slow-weight gradients) sums to one process's gradient of the
    loss over the concatenated batch: the write's cross-rank terms flow back through RankSum's
    all-reduced backward. With the forward-only sum (each rank's loss through its own share) the
    sums differ, so this test can fail."""
    mp.spawn(grad_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"grad{r}.pt", weights_only=True) for r in range(WORLD)]
    layer, x = make_layer_and_batch()
    whole = x.clone().requires_grad_(True)
    layer(whole).pow(2).sum().backward()
    expected = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    assert set(expected) == set(ranks[0]["params"]) and len(expected) >= 3
    for name, grad in expected.items():
        torch.testing.assert_close(ranks[0]["params"][name] + ranks[1]["params"][name], grad, atol=1e-10, rtol=1e-9,
                                   msg=name)
    # The inputs' gradients are each rank's rows of the whole batch's: the later chunks of every
    # rank read a memory written from both ranks' tokens, and the gradient comes back across.
    torch.testing.assert_close(torch.cat([r["input"] for r in ranks]), whole.grad, atol=1e-10, rtol=1e-9)


def audit_worker(rank: int, init_file: str, out_dir: str) -> None:
    from test_sync_free import SyncAudit  # this folder is on the path (pytest's prepend import mode)

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        layer, x = make_layer_and_batch()
        shard = x[2 * rank : 2 * rank + 2]
        counts = {}
        for T in (5, 15):  # 1 and 3 chunks of 5
            for graph in (False, True):
                with SyncAudit() as audit, torch.set_grad_enabled(graph):
                    y = layer(shard[:, :T].clone().requires_grad_(graph))
                    if graph:
                        y.pow(2).mean().backward()
                counts[T, graph] = dict(audit.counts)
        torch.save(counts, os.path.join(out_dir, f"audit{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_data_parallel_writes_read_the_device_twice_per_call_whatever_the_chunks(tmp_path):
    """The ranks' batch sizes once per call and the end-of-call finiteness check; nothing per
    chunk (the old union exchanged lengths and ran `unique` on every chunk)."""
    mp.spawn(audit_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        counts = torch.load(tmp_path / f"audit{rank}.pt", weights_only=False)
        for graph in (False, True):
            assert counts[5, graph] == counts[15, graph] == {"_local_scalar_dense": 2}, (rank, graph, counts)
