"""`clp compare` on the tiny stream: every entry × seed an ordinary run, the table's numbers equal
to the members' results, a re-run trains nothing, bad entries named before any training."""
import csv
import json

import pytest
import yaml

from analysis.metrics import summary
from cl_platform.check import ConfigError
from cl_platform.results import RunResults
from experiments.compare import load, run


def write(tiny, tmp_path, **fields):
    tiny.config(tmp_path / "run.yaml", cl={"curve_every": 100})
    data = {"run": "run.yaml", "name": "t", "seeds": [0, 1],
            "entries": {"naive": ["strategy.name=naive"],
                        "freeze": ["strategy.name=slot_freezing", "strategy.kwargs={fraction: 0.2, budget: 0.5}"]},
            **fields}
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")  # entry order matters
    return path


def test_comparison_table_equals_the_members_and_reruns_train_nothing(tiny, tmp_path):
    said = []
    out, table = run(load(write(tiny, tmp_path)), say=said.append)
    saved = json.loads((out / "comparison.json").read_text())
    for entry in ("naive", "freeze"):
        gains = [summary(RunResults.from_json(f"{m['folder']}/results.json"))["adaptation_gain"]
                 for m in saved["members"][entry]]
        assert len(gains) == 2
        assert table[entry]["adaptation_gain"]["mean"] == pytest.approx(sum(gains) / 2)
    assert table["naive"]["relative_compute"] == 1.0 and table["freeze"]["state_bytes"] > 0
    assert table["naive"]["adaptation_gain"]["mean"] != table["freeze"]["adaptation_gain"]["mean"]
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [r["entry"] for r in rows] == ["naive", "freeze"]
    assert float(rows[1]["adaptation_gain_mean"]) == pytest.approx(table["freeze"]["adaptation_gain"]["mean"])
    again = []
    run(load(write(tiny, tmp_path)), say=again.append)
    assert sum("already complete" in line for line in again) == 4


@pytest.mark.parametrize("fields, message", [
    ({"entries": {"x": ["strategy.name=mamba"]}}, "entry 'x'.*mamba"),
    ({"entries": {"x": ["cl.mode=slow"]}}, "entry 'x'.*cl.mode"),
    ({"entries": {"x": "strategy.name=naive"}}, "list of 'key=value'"),
    ({"seeds": []}, "seeds"),
])
def test_bad_entries_are_named_before_any_training(tiny, tmp_path, fields, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        run(load(write(tiny, tmp_path, **fields)), say=lambda _: None)
