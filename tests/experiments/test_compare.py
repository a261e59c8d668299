"""`clp compare` on the tiny stream: every entry × seed an ordinary run, the table's numbers equal
to the members' results, a re-run trains nothing, bad entries named before any training."""
import csv
import json
from pathlib import Path

import pytest
import yaml

from analysis.metrics import summary
from cl_platform.check import ConfigError
from cl_platform.results import RunResults
from experiments.multi.compare import load, run


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


def test_base_seeds_give_each_member_its_own_base_and_the_spread_comes_from_them(tiny, tmp_path):
    # With one base, naive in fast mode is deterministic: the run seed changes nothing.
    out, table = run(load(write(tiny, tmp_path, entries={"naive": ["strategy.name=naive"]})), say=lambda _: None)
    assert table["naive"]["adaptation_gain"]["std"] == 0.0
    # Two bases (pretrain.seed 0 and 1, each pretrained once and cached): two members, a real spread.
    said = []
    path = write(tiny, tmp_path, entries={"naive": ["strategy.name=naive"]}, seeds=[0], base_seeds=[0, 1])
    out, table = run(load(path), say=said.append)
    saved = json.loads((out / "comparison.json").read_text())
    members = saved["members"]["naive"]
    assert [(m["base_seed"], m["seed"]) for m in members] == [(0, 0), (1, 0)] and saved["base_seeds"] == [0, 1]
    gains = []
    for m in members:
        cfg = yaml.safe_load(Path(m["folder"], "config.yaml").read_text())
        assert cfg["pretrain"]["seed"] == m["base_seed"]
        gains.append(summary(RunResults.from_json(f"{m['folder']}/results.json"))["adaptation_gain"])
    assert gains[0] != gains[1] and table["naive"]["adaptation_gain"]["std"] > 0
    assert table["naive"]["base_seeds"] == [0, 1]
    assert "base seeds [0, 1] x seeds [0]" in (out / "comparison.txt").read_text()
    assert any("base seed 1" in line for line in said)
    with pytest.raises(ConfigError, match="base_seeds"):
        load(write(tiny, tmp_path, base_seeds=[1, 1]))


def test_a_run_config_named_on_the_command_line_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    """As a run config's own paths: `run=` in the file is relative to the file, `run=` on the command
    line to the working directory (it used to be joined to the file's folder: configs/configs/...)."""
    from experiments.multi import compare, sweep_config

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    configs = root / "experiments" / "configs"
    for loader, name in ((compare.load, "compare_strategies.yaml"), (sweep_config.load, "sweeps/fast_lr_chunk.yaml")):
        in_file = loader(configs / name)  # `run: default.yaml` / `run: ../default.yaml` in the file
        assert Path(in_file.run).resolve() == configs / "default.yaml"
        given = loader(configs / name, overrides=["run=experiments/configs/reference_main.yaml"])
        assert Path(given.run) == configs / "reference_main.yaml"
