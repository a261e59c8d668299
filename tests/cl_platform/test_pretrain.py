"""Pretraining the base: clearly better than a unigram model, cached, and resumable exactly."""
import json
import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cl_platform.pretrain import Pretrainer, unigram_losses
from experiments.base import resolve_base
from experiments.setup import base_key, load_setup


def test_base_beats_the_unigram_model_clearly(tiny_base):
    # The margins: the tiny base beats unigram by 0.45-0.86 nats per domain; one machine's bases
    # at 1 and 2 threads differ by up to 0.06 (a float32 trajectory is chaotic), so each bound
    # leaves at least four times that.
    record = tiny_base.record
    assert record["final_eval_mean"] < record["unigram_mean"] - 0.4, record
    for domain, unigram in record["unigram"].items():
        assert record["final_eval"][domain] < unigram - 0.2, domain
    losses = [loss for _, loss in record["loss_curve"]]
    assert len(losses) == 150 and sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 1.5
    assert [step for step, _ in record["eval_curve"]["math"]] == [0, 50, 100, 150]
    folder = tiny_base.path.parent
    assert json.loads((folder / "pretrain.json").read_text())["final_eval"] == record["final_eval"]
    assert not (folder / "last.ckpt").exists()
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("pretrain/lm")] == list(range(5, 151, 5))
    assert {"pretrain/eval/math/loss", "pretrain/unigram/code", "fwpkm/fwpkm1/coverage"} <= set(acc.Tags()["scalars"])


def test_second_request_uses_the_cache(tiny, tiny_base):
    setup = load_setup(tiny.config(tiny.root / "again.yaml", pretrain={"eval_every": 7}))  # reporting only
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append)
    path, record, cached = base.path, base.record, base.how != "pretrained"
    assert cached and path == tiny_base.path and record == tiny_base.record
    assert said and said[0].startswith("base model: cached")
    other = load_setup(tiny.config(tiny.root / "other.yaml", pretrain={"lr": 1e-3}))
    assert base_key(other) != base_key(setup)


def test_a_cpu_without_bfloat16_is_told_where_a_bf16_pretraining_starts_only(tiny, tmp_path, monkeypatch):
    # As on an AVX2-only CPU (a bf16 matmul 36x slower than float32 there): the note comes where a
    # pretraining starts, naming the field; a request the cache answers trains nothing, says nothing.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    setup = load_setup(tiny.config(tmp_path / "bf16.yaml", runs_root=str(tmp_path / "runs")),
                       ["pretrain.steps=2", "pretrain.eval_every=2", "pretrain.precision=bf16-mixed"])
    said, again = [], []
    resolve_base(setup, progress_bar=False, say=said.append)
    notes = [s for s in said if "no native bfloat16" in s]
    assert len(notes) == 1 and "set pretrain.precision=32-true" in notes[0] and "cl.precision" not in notes[0], notes
    base = resolve_base(setup, progress_bar=False, say=again.append)
    cached = base.how != "pretrained"
    assert cached and not any("no native bfloat16" in s for s in again), again


def test_unigram_loss_is_the_smoothed_cross_entropy():
    train = [{"targets": torch.tensor([[2, 2, 3, -100]])}]
    evals = {"d": [{"targets": torch.tensor([[2, 3, -100]])}]}
    got = unigram_losses(train, evals, vocab_size=4)
    # counts (0, 0, 2, 1) + 1 over 3 + 4: p(2) = 3/7, p(3) = 2/7
    assert got["d"] == pytest.approx(-(math.log(3 / 7) + math.log(2 / 7)) / 2)


class Interrupted(Exception):
    pass


@pytest.mark.slow
def test_interrupted_pretraining_resumes_to_the_same_weights(tiny, tmp_path, monkeypatch):
    small = {"steps": 40, "checkpoint_every": 20, "eval_every": 20}
    whole = load_setup(tiny.config(tmp_path / "whole.yaml", runs_root=str(tmp_path / "a"), pretrain=small))
    base = resolve_base(whole, progress_bar=False, say=lambda _: None)
    reference = base.weights

    cut = load_setup(tiny.config(tmp_path / "cut.yaml", runs_root=str(tmp_path / "b"), pretrain=small))
    save = Pretrainer.save_progress

    def save_then_die(self):
        save(self)
        raise Interrupted

    monkeypatch.setattr(Pretrainer, "save_progress", save_then_die)
    with pytest.raises(Interrupted):
        resolve_base(cut, progress_bar=False, say=lambda _: None)
    monkeypatch.setattr(Pretrainer, "save_progress", save)
    before = torch.load(next((tmp_path / "b").glob("pretrain-*/last.ckpt")), weights_only=True)["record"]["seconds"]
    said = []
    base = resolve_base(cut, progress_bar=False, say=said.append)
    record, cached, resumed = base.record, base.how != "pretrained", base.weights
    assert not cached and record["steps"] == 40
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    # the record's seconds sum the sessions: the first one's, up to its checkpoint, are kept
    assert before > 0 and record["seconds"] > before
