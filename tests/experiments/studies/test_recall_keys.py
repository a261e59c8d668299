"""Composite-key recall (issue 53): the n-iter reading carries the memory from each read's write
into the next read, an old config scores as it did, and a grid over recall fields runs one study
per combination with the n-iter readings in its summary."""
import dataclasses

import pytest
import torch

from experiments.studies.recall import (RecallExperiment, accuracy_at, iterative_accuracy, model_config,
                                        read_iteratively, run)

SMALL = dict(recall={"num_keys": 4, "num_values": 8, "num_filler": 6, "num_pairs": 3, "seq_len": 40,
                     "key_tokens": 2, "value_tokens": 2},
             n_layer=2, d_model=32, n_head=2, window=4, fwpkm={"num_subkeys": 8, "d_key": 8, "d_value": 16}, chunk=8,
             eval_distances=[8])


def _model(exp, variant="fwpkm-conv@1"):
    from cl_platform.memory.fwpkm import WriteRule
    from cl_platform.model import FwPKMLM

    torch.manual_seed(0)
    return FwPKMLM(model_config(exp, variant), WriteRule(chunk=exp.chunk, persistence="reset_per_call")).eval()


def _equal(a, b):
    """The memory (keys and values of every layer) bit for bit; read counts are bookkeeping that
    each read adds to, writes or not."""
    return len(a) == len(b) and all(torch.equal(s.keys, t.keys) and torch.equal(s.values, t.values) for s, t in zip(a, b))


def test_each_read_starts_from_the_memory_the_previous_read_wrote():
    from cl_platform.memory.fwpkm import WriteRule
    from streams.recall import recall_batch

    exp = RecallExperiment(**SMALL)
    model = _model(exp)
    rules_before = model.write_rules()
    cfg = exp.recall_config
    ids = recall_batch(cfg, 1, [10], seed=0)["input_ids"]
    context = cfg.queries_at(10)
    trace = []
    logits = read_iteratively(model, ids, context, [1, 2, 3], generator=torch.Generator().manual_seed(7), trace=trace)
    # The model is left as it was found: its write rules and writes on (as training leaves them).
    assert model.write_rules() == rules_before and all(layer.writes_enabled for layer in model.fwpkm_layers())

    # The same chain by hand: a fresh memory from the same generator, two whole-context writes.
    model.set_write_rules(WriteRule(chunk=context, persistence="persist"))
    model.reset_memory(torch.Generator().manual_seed(7))
    for layer in model.fwpkm_layers():
        layer.reset_read_counts()
    states = [model.snapshot_memory()]
    with torch.no_grad():
        for _ in range(2):
            model.set_writes(True)
            model(ids[:, :context])
            states.append(model.snapshot_memory())
        expected = []
        for s in states:
            model.restore_memory(s)
            model.set_writes(False)
            expected.append(model(ids))
    assert [kind for kind, _ in trace] == ["read", "write", "read", "write", "read"]
    s0, s1, s2 = states
    for (_, got), want in zip(trace, [s0, s0, s1, s1, s2]):
        assert _equal(got, want)  # the 2nd read starts from the 1st write's state, the 3rd from the 2nd's
    assert not torch.equal(s1[0].values, s0[0].values) and not torch.equal(s2[0].values, s1[0].values)
    assert not torch.equal(s1[0].keys, s0[0].keys)  # the addressing step moved the keys too
    for n in (1, 2, 3):
        assert torch.equal(logits[n], expected[n - 1])
    assert not torch.equal(logits[2], logits[1])


def test_the_context_write_is_one_step_over_the_context_only():
    # A read of the queries would write their answers: the writes must see the pairs and filler only.
    from streams.recall import recall_batch

    exp = RecallExperiment(**SMALL)
    model = _model(exp)
    cfg = exp.recall_config
    batch = recall_batch(cfg, 2, [10, 10], seed=1)
    a, b = batch["input_ids"][:1], batch["input_ids"][1:].clone()
    context = cfg.queries_at(10)
    b[:, :context] = a[:, :context]  # same context, other queries
    ta, tb = [], []
    read_iteratively(model, a, context, [2], generator=torch.Generator().manual_seed(3), trace=ta)
    read_iteratively(model, b, context, [2], generator=torch.Generator().manual_seed(3), trace=tb)
    assert _equal(ta[-1][1], tb[-1][1])
    assert [layer.writes for layer in model.fwpkm_layers()] == [1]


def test_an_old_config_scores_as_before_per_token():
    # value_tokens 1: exact match of a value is the per-token argmax accuracy the study reported before.
    from cl_platform.constants import IGNORE_INDEX
    from streams.recall import recall_batch

    exp = RecallExperiment(recall={"num_keys": 8, "num_values": 8, "num_filler": 6, "num_pairs": 3, "seq_len": 30},
                           n_layer=2, d_model=32, n_head=2, window=4, fwpkm={"num_subkeys": 8, "d_key": 8, "d_value": 16},
                           eval_distances=[6])
    model = _model(exp, "fwpkm")
    torch.manual_seed(5)
    got = accuracy_at(model, exp, 6, 12, seed=2)
    torch.manual_seed(5)
    test = recall_batch(exp.recall_config, 12, [6] * 12, seed=2)
    hits = total = 0
    with torch.no_grad():
        for i in range(12):
            ids, tgt = test["input_ids"][i:i + 1], test["targets"][i:i + 1]
            mask = tgt != IGNORE_INDEX
            hits += int((model(ids).argmax(-1)[mask] == tgt[mask]).sum())
            total += int(mask.sum())
    assert got == hits / total and total == 36


def test_a_grid_runs_one_study_per_combination_with_its_readings(tmp_path):
    exp = RecallExperiment(**{**SMALL, "recall": {**SMALL["recall"], "seq_len": 48}}, variants=["fwpkm@1", "fwpkm-conv@1"],
                           grid={"num_keys": [4, 3], "key_tokens": [1, 2]}, iterations=[1, 2], steps=2, batch_size=2,
                           sequences_per_forward=1, eval_sequences=2, seeds=[0, 1],
                           runs_root=str(tmp_path))
    points = exp.points()
    assert [(p.recall["num_keys"], p.recall["key_tokens"]) for p in points] == [(4, 1), (4, 2), (3, 1), (3, 2)]
    assert all(p.points() == [] and p.iterations == [1, 2] for p in points)
    said = []
    folder, summaries = run(exp, say=said.append)
    assert set(summaries) == {(4, 1), (4, 2), (3, 1), (3, 2)}
    cell = summaries[(3, 2)]["fwpkm-conv@1"]
    assert set(cell) == {"8", "1-iter", "2-iter", "over_seeds"}
    assert set(cell["over_seeds"]) == {"in-pass", "1-iter", "2-iter"}
    stat = cell["over_seeds"]["2-iter"]["8"]
    assert len(stat["values"]) == 2 and stat["mean"] == pytest.approx(sum(stat["values"]) / 2) == cell["2-iter"]["8"][0]
    table = said[-1]
    assert "num_keys key_tokens" in table and table.count("2-iter") == 8  # 2 variants x 4 points
    # The same sequences as in-pass: iterative_accuracy reads those accuracy_at scores.
    member = dataclasses.replace(points[0], iterations=[1])
    model = _model(member)
    assert set(iterative_accuracy(model, member, 8, 2, seed=1)) == {"1"}
