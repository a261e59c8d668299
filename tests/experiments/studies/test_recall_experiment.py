"""The recall experiment: bad configs named before any training; and, trained for a few hundred
steps, the FwPKM model recalls pairs beyond its attention window while attention alone, and the
memory without its look-ahead target, stay at chance."""
import json

import pytest
import yaml

from cl_platform.check import ConfigError
from experiments.studies.recall import RecallExperiment, load, run


def write(tmp_path, **fields):
    path = tmp_path / "recall.yaml"
    path.write_text(yaml.safe_dump(fields), encoding="utf-8")
    return path


@pytest.mark.parametrize("fields, message", [
    ({"variants": ["attention", "mamba"]}, "variants"),
    ({"eval_distances": [0, 500]}, "recall distance 500 does not fit"),
    ({"recall": {"num_pairs": 99}}, "recall.num_pairs"),
    ({"fwpkm_layer": 2}, "fwpkm_layer"),
    ({"seeds": [1, 1]}, "seeds"),
    ({"stepz": 10}, "stepz"),
    ({"variants": ["fwpkm@2"]}, "layer 2"),
    ({"variants": ["fwpkm@x"]}, "variants"),
    ({"variants": ["attention@1"]}, "variants"),
    ({"sequences_per_forward": 64}, "sequences_per_forward"),
    ({"probe_every": -1}, "probe_every"),
    ({"pairs": [8, 24], "eval_distances": [0, 96]}, "recall distance 96 does not fit"),
    ({"pairs": [8, 8]}, "pairs"),
    ({"grid": {"keys": [4]}}, "grid"),
    ({"grid": {"key_tokens": []}}, "grid"),
    ({"grid": {"num_pairs": [4]}, "pairs": [8]}, "grid"),
    ({"grid": {"key_tokens": [1, 0]}}, "recall.key_tokens"),
    ({"recall": {"num_keys": 10, "num_pairs": 11}}, "recall.num_pairs"),
    ({"recall": {"value_tokens": 0}}, "recall.value_tokens"),
    ({"iterations": [0]}, "iterations"),
    ({"iterations": [2, 2]}, "iterations"),
    ({"variants": ["fwpkm-convv"]}, "variants"),
])
def test_bad_configs_are_named(tmp_path, fields, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load(write(tmp_path, **fields))


@pytest.mark.slow
def test_fwpkm_recalls_beyond_the_window_and_attention_alone_does_not(tmp_path):
    exp = RecallExperiment(variants=["attention", "fwpkm", "fwpkm-no-lookahead"], recall={"num_keys": 32, "num_values": 32, "num_filler": 30, "num_pairs": 2, "seq_len": 48},
                           steps=250, batch_size=16, eval_distances=[24, 40], eval_sequences=32, seeds=[0],
                           runs_root=str(tmp_path / "runs"))
    said = []
    folder, summary = run(exp, say=said.append)
    chance = 1 / 32
    for d in ("24", "40"):  # both far beyond the 8-token window
        assert summary["fwpkm"][d][0] >= 0.9, summary
        assert summary["attention"][d][0] <= 4 * chance, summary
        assert summary["fwpkm-no-lookahead"][d][0] <= 4 * chance, summary  # the paper's ablation: recall collapses
    saved = json.loads((folder / "results.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(summary)) and len(saved["runs"]) == 3
    again = []
    run(exp, say=again.append)  # finished (variant, seed) pairs are read back, not retrained
    assert not any(line.startswith("training") for line in again)


def test_each_ablation_changes_one_setting_of_the_fwpkm_variant():
    from experiments.studies.recall import ABLATIONS, ADDITIONS, DEFAULT_VARIANTS, VARIANTS, model_config

    exp = RecallExperiment()
    full = model_config(exp, "fwpkm")
    assert model_config(exp, "attention").fwpkm_layers == [] and full.fwpkm_layers == [exp.fwpkm_layer]
    assert set(VARIANTS) == {"attention", "fwpkm", *ABLATIONS, *ADDITIONS}
    assert exp.variants == list(DEFAULT_VARIANTS) == ["attention", "fwpkm", *ABLATIONS]  # as before the additions
    for variant, (kind, change) in {**ABLATIONS, **ADDITIONS}.items():
        arch = model_config(exp, variant)
        assert arch.fwpkm_layers == full.fwpkm_layers
        if kind == "arch":  # the architecture differs in exactly the named fields
            assert {k for k in vars(full.fwpkm) if getattr(full.fwpkm, k) != getattr(arch.fwpkm, k)} == set(change)
        elif kind == "model":  # a model field: only it differs
            assert {k for k in vars(full) if getattr(full, k) != getattr(arch, k)} == set(change)
        else:
            assert arch == full  # the write rule carries the change (checked by the slow test for look-ahead)


def test_the_scaling_fields_leave_earlier_identities_alone_and_name_what_they_change():
    import dataclasses

    exp = RecallExperiment()
    before = {k: v for k, v in dataclasses.asdict(exp).items() if k not in ("variants", "seeds", "runs_root", "sequences_per_forward", "probe_every", "pairs", "grid", "iterations")}
    assert exp.identity() == before  # the folder of every earlier result is found again
    assert RecallExperiment(pairs=[8, 4]).identity() == before  # a grid names each point's folder
    assert RecallExperiment(sequences_per_forward=1).identity() == {**before, "sequences_per_forward": 1}
    assert RecallExperiment(probe_every=5).identity() == {**before, "probe_every": 5}
    assert RecallExperiment(iterations=[1, 2]).identity() == {**before, "iterations": [1, 2]}
    assert RecallExperiment(grid={"num_keys": [16, 10]}).identity() == before
    point = RecallExperiment(pairs=[8, 4]).at_pairs(4)
    assert point.recall_config.num_pairs == 4 and point.pairs == []
    assert point.identity() == {**before, "recall": {"num_pairs": 4}}


def test_a_variant_at_a_layer_moves_only_its_memory():
    from experiments.studies.recall import model_config

    exp = RecallExperiment()
    assert model_config(exp, "fwpkm@1").fwpkm_layers == [1]
    assert model_config(exp, "fwpkm@0") == model_config(exp, "fwpkm")
    assert model_config(exp, "fwpkm-no-gate@1").fwpkm.gate is False


@pytest.mark.slow
def test_a_memory_shared_by_the_batch_cannot_learn_pairs_that_collide_and_one_per_sequence_can(tmp_path):
    # Every sequence uses all 8 keys with its own values: in one memory per batch the 16
    # sequences' pairs overwrite each other, so nothing recallable is written in training. With a
    # memory per sequence (as at evaluation) the same model, steps and data learn the task. The
    # grid also runs the shared case at 1 pair, where collisions are rare and it does learn.
    chance = 1 / 16
    common = dict(variants=["fwpkm"], recall={"num_keys": 8, "num_values": 16, "num_filler": 16, "seq_len": 64},
                  steps=120, batch_size=16, eval_distances=[24], eval_sequences=32, seeds=[0], pairs=[1, 8],
                  runs_root=str(tmp_path / "runs"))
    said = []
    _, shared = run(RecallExperiment(**common), say=said.append)
    _, own = run(RecallExperiment(**common, sequences_per_forward=1, probe_every=20), say=said.append)
    assert shared[8]["fwpkm"]["24"][0] <= 3 * chance, shared
    assert shared[1]["fwpkm"]["24"][0] >= 0.9, shared
    assert own[8]["fwpkm"]["24"][0] >= 0.9, own
    steps = own[8]["fwpkm"]["steps_to_90"][0]
    assert steps is not None and steps <= 120
    assert any("pairs" in line and "steps to 90 %" in line for line in said)  # the grid's one table
