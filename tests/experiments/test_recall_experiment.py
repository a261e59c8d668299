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
    from experiments.studies.recall import ABLATIONS, VARIANTS, model_config

    exp = RecallExperiment()
    full = model_config(exp, "fwpkm")
    assert model_config(exp, "attention").fwpkm_layers == [] and full.fwpkm_layers == [exp.fwpkm_layer]
    assert set(VARIANTS) == {"attention", "fwpkm", *ABLATIONS}
    for variant, (kind, change) in ABLATIONS.items():
        arch = model_config(exp, variant)
        assert arch.fwpkm_layers == full.fwpkm_layers
        if kind == "arch":  # the architecture differs in exactly the named fields
            assert {k for k in vars(full.fwpkm) if getattr(full.fwpkm, k) != getattr(arch.fwpkm, k)} == set(change)
        else:
            assert arch == full  # the write rule carries the change (checked by the slow test for look-ahead)
