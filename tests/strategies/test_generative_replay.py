"""Self-generated replay: the texts kept are the model's own samples (with its memory as the
experience left it), nothing from the stream; rows appended to batches are made of them,
deterministically by step; the state resumes exactly; bad settings are named."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.sample import sample
from cl_platform.strategy import StrategyContext
from streams.packing import PackedSegments
from strategies import get_strategy
from strategies.generative_replay import GenerativeReplay

V, T = 61, 24
EOT_ID = 0  # the fake stream's <|endoftext|>


def _model() -> FwPKMLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, window=6, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4))
    return FwPKMLM(cfg, rule=WriteRule(chunk=8))


def fake_stream(n_exps=3, n_segments=4):
    exps = []
    for t in range(1, n_exps + 1):
        tokens = np.full((n_segments, T + 1), 100 + t)  # no stream token is below 100 ...
        segments = PackedSegments(tokens, np.zeros_like(tokens), eot_id=EOT_ID, domain=f"d{t}", split="adapt")
        exps.append(SimpleNamespace(data=SimpleNamespace(segments=segments), domain=f"d{t}"))
    return exps


def ctx_for(model, stream, t, step=0):
    return StrategyContext(model=model, experience=t, domain=f"d{t}", global_step=step, stream=stream,
                           current=stream[t - 1], num_experiences=len(stream))


def _batch(n=4):
    seg = fake_stream()[0].data.segments
    return {key: torch.stack([seg[i][key] for i in range(n)]) for key in seg[0]}


def test_kept_texts_are_the_models_samples_and_the_last_experience_keeps_none():
    model, stream = _model(), fake_stream()
    s = GenerativeReplay(samples=5, length=10, seed=3)
    s.on_experience_end(ctx_for(model, stream, 1))
    expected = sample(model, 5, 10, generator=torch.Generator().manual_seed(3 * 1_000_003 + 1), start=EOT_ID)
    assert torch.equal(s.texts[1].long(), expected) and s.texts[1].dtype == torch.int32
    assert (s.pool() < V).all()  # ... so every kept token came from the model, none from the stream
    model(torch.randint(0, V, (2, 16)))  # experience 2 changes the memory: other texts
    s.on_experience_end(ctx_for(model, stream, 2))
    assert not torch.equal(s.texts[1], s.texts[2])
    s.on_experience_end(ctx_for(model, stream, 3))
    assert sorted(s.texts) == [1, 2]
    assert s.summary() == {"generated_texts": {"1": 5, "2": 5}, "generated_tokens": 110, "bytes": 440}


def test_batches_get_rows_of_generated_texts_deterministically():
    model, stream = _model(), fake_stream()
    s = GenerativeReplay(samples=6, length=9, ratio=0.5)
    batch = _batch(4)
    assert s.transform_batch(batch, ctx_for(model, stream, 1, step=3)) is batch  # nothing kept yet
    s.on_experience_end(ctx_for(model, stream, 1))
    out = s.transform_batch(batch, ctx_for(model, stream, 2, step=3))
    assert {k: tuple(v.shape) for k, v in out.items()} == {k: (6, T) for k in batch}
    assert all(torch.equal(out[k][:4], batch[k]) for k in batch)
    new = torch.cat([out["input_ids"][4:], out["targets"][4:, -1:]], dim=1)  # (2, T + 1) rows
    texts = {tuple(r) for r in s.pool().tolist()}
    for row in new.tolist():  # whole texts of length + 1 = 10, the last one cut at T + 1 = 25
        pieces = [tuple(row[i:i + 10]) for i in range(0, 20, 10)]
        assert all(p in texts for p in pieces) and any(tuple(row[20:]) == t[:5] for t in texts)
    assert torch.equal(out["targets"][4:, :-1], out["input_ids"][4:, 1:])
    assert torch.equal(out["doc_start"][4:], out["input_ids"][4:] == EOT_ID)
    assert out["doc_index"][4:, 0].tolist() == [0, 0] and out["doc_index"][4:, 10].tolist() == [1, 1]
    again = s.transform_batch(batch, ctx_for(model, stream, 2, step=3))
    assert all(torch.equal(out[k], again[k]) for k in out)
    other = s.transform_batch(batch, ctx_for(model, stream, 2, step=4))
    assert not torch.equal(out["input_ids"], other["input_ids"])


def test_resume_restores_the_texts_exactly():
    model, stream = _model(), fake_stream()
    s = GenerativeReplay(samples=3, length=9)
    s.on_experience_end(ctx_for(model, stream, 1))
    resumed = get_strategy("generative_replay", samples=3, length=9)
    resumed.load_state_dict(s.state_dict())
    a = s.transform_batch(_batch(), ctx_for(model, stream, 2, step=7))
    b = resumed.transform_batch(_batch(), ctx_for(model, stream, 2, step=7))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="expected \\['texts'\\]"):
        resumed.load_state_dict({"storage": None})


@pytest.mark.parametrize("kwargs, message", [
    ({"samples": 0}, "samples must be a positive int"), ({"length": 1.5}, "length must be a positive int"),
    ({"ratio": 0}, r"ratio must be in \(0, 4\]"), ({"temperature": -1}, "temperature must be a number > 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=f"generative_replay: {message}"):
        GenerativeReplay(**kwargs)


def test_a_text_longer_than_the_segments_is_refused_before_training():
    with pytest.raises(ValueError, match=f"length 25 is longer than the stream's segments \\({T} tokens\\)"):
        GenerativeReplay(length=25).check(None, "fast", fake_stream())
    GenerativeReplay(length=T).check(None, "fast", fake_stream())
