"""Replay: Avalanche's storage policies on segment ids (balance, reservoir statistics), batches
with the buffered segments appended as stored, deterministic draws and an exact resume."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cl_platform.strategy import StrategyContext
from streams.packing import PackedSegments
from strategies import get_strategy
from strategies.replay import Replay


def fake_stream(n_exps=3, n_segments=20, T=8):
    """Experiences whose segments say where they come from: token = 100·experience + index."""
    exps = []
    for t in range(1, n_exps + 1):
        tokens = np.array([[100 * t + i] * (T + 1) for i in range(n_segments)])
        segments = PackedSegments(tokens, np.zeros_like(tokens), eot_id=-1, domain=f"d{t}", split="adapt")
        exps.append(SimpleNamespace(data=SimpleNamespace(segments=segments), domain=f"d{t}"))
    return exps


def ctx_for(stream, t, step=0):
    return StrategyContext(model=torch.nn.Linear(1, 1), experience=t, domain=f"d{t}", global_step=step,
                           stream=stream, current=stream[t - 1])


def per_experience(strategy):
    ids = strategy.buffered()
    return [int((ids[:, 0] == t).sum()) for t in (1, 2, 3)]


def test_balanced_buffer_splits_the_room_evenly_and_holds_past_experiences_only():
    stream = fake_stream()
    s = Replay(size=10, policy="balanced")
    torch.manual_seed(0)
    s.on_experience_end(ctx_for(stream, 1))
    assert per_experience(s) == [10, 0, 0]
    s.on_experience_end(ctx_for(stream, 2))
    assert per_experience(s) == [5, 5, 0]
    assert s.summary() == {"buffered_segments": {"1": 5, "2": 5}, "stored_tokens": 10 * 8}  # 10 segments of T = 8
    s.on_experience_end(ctx_for(stream, 3))
    assert sorted(per_experience(s)) == [3, 3, 4] and len(set(map(tuple, s.buffered().tolist()))) == 10


def test_reservoir_keeps_a_uniform_sample_of_the_stream():
    counts = []
    for seed in range(200):
        torch.manual_seed(seed)
        s = Replay(size=30, policy="reservoir")
        for t, n in ((1, 60), (2, 30), (3, 90)):  # 180 segments: 1/3, 1/6, 1/2 of the stream
            s.add(t, n, seq_len=8)
        counts.append(per_experience(s))
    mean = np.mean(counts, axis=0)
    assert np.allclose(mean, [10, 5, 15], atol=0.6), mean  # E = 30 · share; sd of the mean ≈ 0.17
    assert all(sum(c) == 30 for c in counts)


def test_batches_get_buffered_segments_appended_as_stored():
    stream = fake_stream()
    s = get_strategy("replay", size=8, policy="balanced", ratio=0.5, seed=3)
    batch = stream[1].data.segments[0]
    batch = {k: torch.stack([v, v, v, v]) for k, v in batch.items()}
    ctx = ctx_for(stream, 2, step=7)
    assert s.transform_batch(batch, ctx) is batch  # empty buffer: the batch as it was
    torch.manual_seed(0)
    s.on_experience_end(ctx_for(stream, 1))
    out = s.transform_batch(batch, ctx)
    assert out["input_ids"].shape == (6, 8) and torch.equal(out["input_ids"][:4], batch["input_ids"])
    picks = s.draw(7, 4)
    for row, (t, i) in zip(out["input_ids"][4:], picks.tolist()):
        assert t == 1 and row.tolist() == [100 + i] * 8  # the stored segment, from experience 1
    assert torch.equal(s.transform_batch(batch, ctx)["input_ids"], out["input_ids"])  # same step, same draw


@pytest.mark.parametrize("policy", ["reservoir", "balanced"])
def test_resume_restores_the_buffer_exactly(policy):
    stream = fake_stream()
    a = Replay(size=9, policy=policy)
    torch.manual_seed(1)
    a.on_experience_end(ctx_for(stream, 1))
    a.on_experience_end(ctx_for(stream, 2))
    b = Replay(size=9, policy=policy)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.buffered(), b.buffered())
    for s in (a, b):
        torch.manual_seed(5)
        s.on_experience_end(ctx_for(stream, 3))
    assert torch.equal(a.buffered(), b.buffered())
    assert torch.equal(a.draw(11, 8), b.draw(11, 8))


@pytest.mark.parametrize("kwargs, message", [
    ({"size": 0}, "size"), ({"size": 4, "tokens": 64}, "exactly one"), ({"policy": "fifo"}, "policy"),
    ({"ratio": 0}, "ratio"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Replay(**kwargs)


def test_size_in_tokens():
    s = Replay(size=None, tokens=40, policy="reservoir")
    torch.manual_seed(0)
    s.add(1, 20, seq_len=8)
    assert len(s.buffered()) == 5
