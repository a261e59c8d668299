"""`clp compare` on the tiny stream: every entry × seed an ordinary run, the table's numbers equal
to the members' results, a re-run trains nothing, bad entries named before any training."""
import csv
import json
import re
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
    assert table["naive"]["stored_tokens"] == table["freeze"]["stored_tokens"] == 0  # a slot mask is not data
    assert table["naive"]["adaptation_gain"]["mean"] != table["freeze"]["adaptation_gain"]["mean"]
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [r["entry"] for r in rows] == ["naive", "freeze"]
    assert float(rows[1]["adaptation_gain_mean"]) == pytest.approx(table["freeze"]["adaptation_gain"]["mean"])
    # The paired difference: member by member (same seed), its mean and t-interval over the pairs.
    diffs = [f["summary"]["average_forgetting"] - n["summary"]["average_forgetting"]
             for n, f in zip(saved["members"]["naive"], saved["members"]["freeze"])]
    vs = table["freeze"]["vs_first"]["average_forgetting"]
    assert vs["vs"] == "naive" and vs["values"] == pytest.approx(diffs) and "vs_first" not in table["naive"]
    assert vs["mean"] == pytest.approx(sum(diffs) / 2) and vs["t95"][0] <= vs["mean"] <= vs["t95"][1]
    assert "paired differences from naive" in (out / "comparison.txt").read_text()
    # ... and within each pair, over the documents both runs scored: the point is the difference
    for n, f in zip(saved["members"]["naive"], saved["members"]["freeze"]):
        docs = f["vs_first_documents"]["average_forgetting"]
        point = f["summary"]["average_forgetting"] - n["summary"]["average_forgetting"]
        assert docs["value"] == pytest.approx(point) and docs["low"] <= point <= docs["high"]
    # One seed: that document interval is the one printed (the seed-0 members are reused).
    out1, table1 = run(load(write(tiny, tmp_path, seeds=[0])), say=lambda _: None)
    assert json.dumps(table1["freeze"]["vs_first_documents"]) == json.dumps(saved["members"]["freeze"][0]["vs_first_documents"])
    text1 = (out1 / "comparison.txt").read_text()
    assert "paired bootstrap over evaluation documents, within this base" in text1
    # One seed has no spread, and two experiences no retention two experiences later: said, not `nan`.
    assert not re.search(r"\bnan\b", text1), text1
    gain = table1["naive"]["adaptation_gain"]["mean"]
    assert f"{gain:+.4f} ± n/a (1 seed)" in text1
    assert "\n  retention after 2: n/a (needs ≥ 3 experiences and a gain to retain)\n" in text1
    assert not re.search(r"\bnan\b", (out / "comparison.txt").read_text())  # two seeds
    # The tiny stream evaluates 2 math documents and 1 code document: too few for those intervals.
    assert text1.endswith("\n  intervals not meaningful for math, code: fewer than 5 evaluation documents to resample "
                          "(set token_budget.eval_docs: N in the stream YAML to cut each domain's eval budget into N "
                          "documents)\n")
    assert said[-1] == f"report: clp report {out}   (HTML + Markdown into {out / 'report'}/)"
    # ... and as fractions of naive's, the documents' interval over naive's value held fixed
    rel = table1["freeze"]["relative"]["forgetting_cut"]
    naive_f = table1["naive"]["average_forgetting"]["mean"]
    assert rel["mean"] == pytest.approx(-table1["freeze"]["vs_first_documents"]["average_forgetting"]["value"] / naive_f)
    assert rel["documents"]["low"] <= rel["mean"] <= rel["documents"]["high"]
    assert f"{100 * rel['mean']:.1f} % [{100 * rel['documents']['low']:.1f}, " in text1 and "held fixed" in text1
    again = []
    run(load(write(tiny, tmp_path)), say=again.append)
    assert sum("already complete" in line for line in again) == 4


def test_data_kept_is_the_replay_buffers_tokens_wherever_a_composite_nests_them(tmp_path):
    from experiments.multi.compare import stored_tokens

    assert stored_tokens(tmp_path) == 0  # no strategy.json
    (tmp_path / "strategy.json").write_text(json.dumps({
        "name": ["replay", "generative_replay"], "after_experience": 3,
        "Replay#0": {"buffered_segments": {"1": 32, "2": 32}, "stored_tokens": 131072},
        "GenerativeReplay#1": {"generated_texts": {"1": 32}, "generated_tokens": 16416}}))
    assert stored_tokens(tmp_path) == 131072


def test_paired_differences_match_members_by_base_and_seed_and_refuse_unmatched_ones():
    from experiments.multi.compare import METRICS, paired

    def member(base, seed, forgetting):
        return {"base_seed": base, "seed": seed, "summary": {m: forgetting if m == "average_forgetting" else 1.0
                                                             for m in METRICS}}
    a = [member(0, 0, 0.40), member(1, 0, 0.50), member(2, 0, 0.30)]
    b = [member(2, 0, 0.10), member(0, 0, 0.12), member(1, 0, 0.20)]  # another order: pairs by key
    d = paired(a, b, "naive", "replay")["average_forgetting"]
    assert d["values"] == pytest.approx([-0.20, -0.28, -0.30]) and d["mean"] == pytest.approx(-0.26)
    # t(0.975, 2) = 4.3027 (tables); sample std of the three differences
    half = 4.3027 * 0.052915 / 3 ** 0.5
    assert d["t95"] == pytest.approx([-0.26 - half, -0.26 + half], abs=1e-4) and d["t95"][1] < 0
    assert paired(a, b, "naive", "replay")["adaptation_gain"]["values"] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="same members to pair"):
        paired(a, b[:2], "naive", "replay")


def test_orders_pair_members_by_order_and_the_interval_is_over_bases_when_orders_repeat_a_base():
    from experiments.multi.compare import METRICS, paired

    def member(base, order, forgetting):
        return {"base_seed": base, "order": order, "seed": 0,
                "summary": {m: forgetting if m == "average_forgetting" else 1.0 for m in METRICS}}
    ab, ba = ["math", "code"], ["code", "math"]
    a = [member(0, ab, 0.40), member(0, ba, 0.44), member(1, ab, 0.50), member(1, ba, 0.58)]
    b = [member(1, ba, 0.20), member(0, ab, 0.10), member(1, ab, 0.22), member(0, ba, 0.12)]  # paired by key
    d = paired(a, b, "naive", "x")["average_forgetting"]
    assert d["values"] == pytest.approx([-0.38, -0.30, -0.28, -0.32]) and d["mean"] == pytest.approx(-0.32)
    # Over the two bases, each the mean of its two orders: -0.31 and -0.33; t(0.975, 1) = 12.706.
    over = d["over_bases"]
    assert over["values"] == pytest.approx([-0.31, -0.33]) and over["mean"] == pytest.approx(-0.32)
    half = 12.706 * 0.0141421 / 2 ** 0.5
    assert over["t95"] == pytest.approx([-0.32 - half, -0.32 + half], abs=1e-3)
    with pytest.raises(ValueError, match="same members to pair"):  # an order missing from one entry
        paired(a, [member(0, ab, 0.1), member(0, ab, 0.1), member(1, ab, 0.2), member(1, ba, 0.2)], "naive", "x")
    # One base: nothing to cluster, the interval is over the pairs.
    assert "over_bases" not in paired(a[:2], b[1::2], "naive", "x")["average_forgetting"]


def test_domain_orders_are_a_dimension_of_the_comparison(tiny, tmp_path):
    orders = [["math", "code"], ["code", "math"]]
    said = []
    out, table = run(load(write(tiny, tmp_path, seeds=[0], orders=orders)), say=said.append)
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["orders"] == orders
    for entry in ("naive", "freeze"):
        members = saved["members"][entry]
        assert [m["order"] for m in members] == orders and table[entry]["orders"] == orders
        for m in members:  # each member streamed its own order
            assert yaml.safe_load(Path(m["folder"], "config.yaml").read_text())["order"] == m["order"]
            assert RunResults.from_json(f"{m['folder']}/results.json").matrix.experiences == m["order"]
    gains = [summary(RunResults.from_json(f"{m['folder']}/results.json"))["adaptation_gain"]
             for m in saved["members"]["naive"]]
    assert gains[0] != gains[1]  # the order changes what the stream measures
    vs = table["freeze"]["vs_first"]["adaptation_gain"]
    expect = [summary(RunResults.from_json(f"{f['folder']}/results.json"))["adaptation_gain"] - g
              for f, g in zip(saved["members"]["freeze"], gains)]
    assert vs["values"] == pytest.approx(expect)
    assert "2 orders x seeds [0]" in (out / "comparison.txt").read_text()
    assert any("order code -> math" in line for line in said)


@pytest.mark.parametrize("orders, message", [
    ([["math", "math"]], r"orders\[0\] \['math', 'math'\] is not a permutation of the stream's domains"),
    ([["math"]], r"orders\[0\] \['math'\] is not a permutation"),
    ([["math", "code"], ["math", "code"]], "distinct domain orders"),
    ([["math", "physics"]], "physics"),
])
def test_an_order_that_is_not_a_permutation_of_the_streams_domains_is_refused_before_any_training(
        tiny, tmp_path, orders, message):
    runs = tmp_path / "runs"
    tiny.config(tmp_path / "run.yaml", runs_root=str(runs))
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({"run": "run.yaml", "seeds": [0], "orders": orders,
                                    "entries": {"naive": ["strategy.name=naive"]}}), encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        run(load(path), say=lambda _: None)
    assert not runs.exists() or not any(runs.iterdir())  # nothing trained, nothing written


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

    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(root)
    configs = root / "experiments" / "configs"
    for loader, name in ((compare.load, "compare_strategies.yaml"), (sweep_config.load, "sweeps/fast_lr_chunk.yaml")):
        in_file = loader(configs / name)  # `run: default.yaml` / `run: ../default.yaml` in the file
        assert Path(in_file.run).resolve() == configs / "default.yaml"
        given = loader(configs / name, overrides=["run=experiments/configs/reference_main.yaml"])
        assert Path(given.run) == configs / "reference_main.yaml"


def test_the_cut_and_gain_kept_are_per_base_ratios_with_intervals_over_bases_pairs_or_documents():
    from experiments.multi.compare import METRICS, format_table, relative

    def member(base, order, forgetting, gain, docs=None):
        m = {"base_seed": base, "order": order, "seed": 0,
             "summary": {m: {"average_forgetting": forgetting, "adaptation_gain": gain}.get(m, 1.0) for m in METRICS}}
        if docs:
            m["vs_first_documents"] = docs
        return m
    ab, ba = ["math", "code"], ["code", "math"]
    a = [member(0, ab, 0.40, 0.50), member(0, ba, 0.60, 0.70), member(1, ab, 0.30, 0.40), member(1, ba, 0.50, 0.40)]
    b = [member(0, ab, 0.20, 0.45), member(0, ba, 0.30, 0.60), member(1, ab, 0.24, 0.36), member(1, ba, 0.16, 0.36)]
    r = relative(a, b)
    # base 0: 1 − 0.25/0.50 = 0.50, gain 0.525/0.60 = 0.875; base 1: 1 − 0.20/0.40 = 0.50, 0.36/0.40 = 0.90
    cut, kept = r["forgetting_cut"], r["gain_kept"]
    assert cut["unit"] == "base" and cut["values"] == pytest.approx([0.50, 0.50]) and cut["t95"] == pytest.approx([0.5, 0.5])
    assert kept["values"] == pytest.approx([0.875, 0.90])
    half = 12.706 * 0.0176777 / 2 ** 0.5  # t(0.975, 1); sample std of 0.875, 0.90
    assert kept["t95"] == pytest.approx([0.8875 - half, 0.8875 + half], abs=1e-3)
    # one base: each pair is a unit
    one = relative(a[:2], b[:2])["forgetting_cut"]
    assert one["unit"] == "pair" and one["values"] == pytest.approx([0.5, 0.5])
    # one pair: the documents' interval of the difference, over the reference's value held fixed
    docs = {"average_forgetting": {"value": -0.2, "low": -0.26, "high": -0.12},
            "adaptation_gain": {"value": -0.05, "low": -0.10, "high": 0.02}}
    single = relative(a[:1], [member(0, ab, 0.20, 0.45, docs)])
    assert single["forgetting_cut"]["mean"] == pytest.approx(0.5)
    assert single["forgetting_cut"]["documents"] == pytest.approx({"low": 0.30, "high": 0.65})
    assert single["gain_kept"]["documents"] == pytest.approx({"low": 0.80, "high": 1.04})
    # a zero reference has no fractions
    assert relative([member(0, ab, 0.0, 0.5)], [member(0, ab, 0.1, 0.5)]).keys() == {"gain_kept"}
    # printed as percentages with the interval of the unit
    row = {"mode": "fast", "final_perplexity": {"mean": 1.0, "std": 0.0}, "relative_compute": 1.0, "state_bytes": 0,
           **{m: {"mean": 0.0, "std": 0.0} for m in METRICS}}
    vs = {m: {"mean": 0.0, "t95": [0.0, 0.0], "values": [0.0] * 4, "over_bases": {"t95": [0.0, 0.0]}} for m in METRICS}
    text = format_table({"naive": row, "x": {**row, "vs_first": vs, "relative": r}}, [0], [0, 1], [ab, ba])
    assert "relative to naive" in text and "t-interval over the 2 bases" in text
    assert f"50.0 % [50.0, 50.0]" in text and f"88.8 % [{100 * (0.8875 - half):.1f}, {100 * (0.8875 + half):.1f}]" in text


def test_run_level_overrides_reach_every_member_and_the_comparison_folder(tiny, tmp_path):
    """`clp compare FILE runs_root=DIR cl.batch_size=4`: keys that are not the file's go to every
    member's run config (and so the comparison lands under DIR); the file's own keys stay its own."""
    elsewhere = tmp_path / "elsewhere"
    comp = load(write(tiny, tmp_path, seeds=[0]), overrides=[f"runs_root={elsewhere}", "cl.batch_size=4", "name=moved"])
    assert comp.run_overrides == [f"runs_root={elsewhere}", "cl.batch_size=4"] and comp.name == "moved"
    out, _ = run(comp, say=lambda _: None)
    assert out.parent == elsewhere and out.name.startswith("compare-moved-")
    saved = json.loads((out / "comparison.json").read_text())
    folders = [Path(m["folder"]) for ms in saved["members"].values() for m in ms]
    assert len(folders) == 2 and all(f.parent == elsewhere for f in folders)
    for f in folders:
        assert yaml.safe_load((f / "config.yaml").read_text())["cl"]["batch_size"] == 4
    # A run-level key the run config does not have is refused by name before any member trains.
    with pytest.raises(ConfigError, match=r"unknown field 'cl.bach_size'"):
        run(load(write(tiny, tmp_path, seeds=[0]), overrides=[f"runs_root={tmp_path / 'x'}", "cl.bach_size=4"]),
            say=lambda _: None)
    assert not (tmp_path / "x").exists()


class _Planted:
    """What a hostile run folder could hold: unpickling it would create `marker`."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_pickled_object_in_a_run_checkpoint_is_refused_and_never_run(tmp_path):
    """Run folders are shared (sweep workers on several machines, colleagues' runs): every
    checkpoint is read with weights_only=True, so an object planted in one is refused with one line
    naming the file, and its code does not run."""
    import torch

    from cl_platform.checkpoint import FORMAT, CheckpointError
    from experiments.multi.compare import state_bytes

    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    marker = tmp_path / "executed"
    torch.save({"format": FORMAT, "kind": "run", "strategy": {"x": _Planted(str(marker))}},
               folder / "checkpoints" / "last.ckpt")
    with pytest.raises(CheckpointError) as info:
        state_bytes(folder)
    message = str(info.value)
    assert message.startswith(f"checkpoint {folder / 'checkpoints' / 'last.ckpt'} cannot be read") and "\n" not in message
    assert not marker.exists()
    # The same file read without the guard would have run the planted code: the test can fail.
    torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)
    assert marker.exists()
