"""`clp eval` (long-context loss by position): positions within documents against a loop, bucketed
losses that merge to the model's own loss, and the family run on the tiny stream."""
import json

import numpy as np
import pytest
import torch
import yaml

from cl_platform.check import ConfigError
from experiments.studies.longctx import context_positions, load, run, score


def test_context_positions_against_a_loop():
    g = torch.Generator().manual_seed(0)
    starts = torch.rand(3, 40, generator=g) < 0.1
    starts[1, 0] = True
    pos = context_positions(starts)
    for b in range(3):
        last = 0
        for t in range(40):
            if starts[b, t]:
                last = t
            assert pos[b, t] == t - last


def family(tiny, tmp_path, **fields):
    base = tiny.config(tmp_path / "base.yaml")
    data = {"base": "base.yaml", "variants": {"attention": {"fwpkm_layers": []}, "fwpkm": {}},
            "buckets": [0, 8, 16, 32], "bootstrap_samples": 50, **fields}
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path, base


@pytest.mark.parametrize("fields, message", [
    ({"variants": {"attention": {"n_layer": 3}}}, "may set only"),
    ({"variants": {"knob": {"stream": 3}}}, "variant 'knob': stream"),
    ({"reference": "mamba"}, "reference"),
    ({"buckets": [8, 16, 32]}, "buckets"),
    ({"buckets": [0, 16, 8]}, "buckets"),
    ({"split": "test"}, "split"),
    ({"settings": ["on", "doc"]}, "settings.*'off' among them"),
    ({"settings": ["off", "reset"]}, "settings"),
    ({"variantz": {}}, "variantz"),
])
def test_bad_configs_are_named(tiny, tmp_path, fields, message):
    path, _ = family(tiny, tmp_path, **fields)
    with pytest.raises((ConfigError, ValueError), match=message):
        load(path)


def test_errors_before_any_pretraining(tiny, tmp_path):
    path, _ = family(tiny, tmp_path, buckets=[0, 8, 16], runs_root=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="buckets.*32-token segments"):
        run(load(path))
    path, _ = family(tiny, tmp_path, variants={"attention": {"fwpkm_layers": [5]}}, runs_root=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match="variant 'attention'.*fwpkm_layers"):
        run(load(path))
    assert not (tmp_path / "runs").exists()


def test_a_stream_variant_pretrains_on_its_own_stream(tiny, tmp_path):
    """A variant's `stream` is read from the base run config's folder, whatever the working
    directory, and changes the base key only through the data it pretrains on."""
    import os

    spec = yaml.safe_load(tiny.stream.read_text())
    # Another pretraining mix (the tiny 32-token segments are too short for retrieval episodes).
    tiny.write_yaml(tmp_path / "knob.yaml", {**spec, "token_budget": {**spec["token_budget"], "pretrain": 8192}})
    tiny.write_yaml(tmp_path / "copy.yaml", spec)
    path, _ = family(tiny, tmp_path, variants={"fwpkm": {}, "knob": {"stream": "knob.yaml"},
                                               "copy": {"stream": "copy.yaml"}})
    from experiments.setup import base_key
    from experiments.studies.family import load_family

    fam = load_family(path)
    fam.setup("fwpkm", 0)  # (imports everything before the working directory moves)
    (tmp_path / "elsewhere").mkdir()
    here = os.getcwd()
    try:
        os.chdir(tmp_path / "elsewhere")  # another working directory: the path must not follow it
        setups = {v: fam.setup(v, 0) for v in ("fwpkm", "knob", "copy")}
    finally:
        os.chdir(here)
    assert setups["knob"].config.stream == str((tmp_path / "knob.yaml").resolve())
    keys = {v: base_key(s) for v, s in setups.items()}
    assert keys["copy"] == keys["fwpkm"]  # the same data under another name
    assert keys["knob"] != keys["fwpkm"]  # another pretraining split
    bad = load_family(family(tiny, tmp_path, variants={"knob": {"stream": "missing.yaml"}})[0])
    with pytest.raises(ConfigError, match="variant 'knob'.*missing.yaml"):
        bad.setup("knob", 0)


def test_buckets_merge_to_the_models_own_loss(tiny_base):
    """Writes off: the bucketed sums add up to the split's loss from a plain batched forward.
    Writes on: to a loop that restores the memory and reads one segment at a time."""
    from experiments.setup import build_model

    setup = tiny_base.setup
    weights = torch.load(tiny_base.path, weights_only=True)["model"]
    scores = score(setup, weights, "eval", [0, 4, 16, 32])
    model = build_model(setup.model_config, 0, setup.config.pretrain.fwpkm)
    model.load_state_dict(weights)
    model.eval()
    memory = model.snapshot_memory()
    for name, data in setup.scenario.domains.items():
        seg = data.splits["eval"].segments
        batch = [seg[i] for i in range(len(seg))]
        x = torch.stack([b["input_ids"] for b in batch])
        y = torch.stack([b["targets"] for b in batch])
        model.set_writes(False)
        with torch.no_grad():
            _, off = model(x, y)
        on_sum, n = 0.0, 0
        model.set_writes(True)
        for b in batch:
            model.restore_memory(memory)
            with torch.no_grad():
                _, loss = model(b["input_ids"][None], b["targets"][None])
            k = int((b["targets"] != -100).sum())
            on_sum, n = on_sum + float(loss) * k, n + k
        model.restore_memory(memory)
        for setting, want in (("off", float(off)), ("on", on_sum / n)):
            got = scores[name][setting]
            counts = np.array(got["counts"])
            assert counts.sum() == n == seg.n_tokens
            assert np.array(got["sums"]).sum() / counts.sum() == pytest.approx(want, rel=1e-5)
            assert got["mean"] == pytest.approx(want, rel=1e-5)
        # writing while reading changes what later chunks read
        assert not np.allclose(scores[name]["on"]["sums"], scores[name]["off"]["sums"])


def test_family_run_writes_results_table_and_plot_and_reuses_them(tiny, tmp_path):
    path, _ = family(tiny, tmp_path, runs_root=str(tiny.runs))
    said = []
    folder, _ = run(load(path), say=said.append)
    assert (folder / "table.txt").is_file() and (folder / "positions.png").stat().st_size > 1000
    saved = json.loads((folder / "results.json").read_text())
    assert saved["domains"] == ["math", "code"] and set(saved["means"]) == {"attention", "fwpkm"}
    assert "on" not in saved["means"]["attention"]["math"]  # no memory, nothing to write
    diff = saved["differences"]["on_minus_off"]["fwpkm"]["math"][0]
    on, off = saved["means"]["fwpkm"]["math"]["on"], saved["means"]["fwpkm"]["math"]["off"]
    assert [c["value"] for c in diff] == pytest.approx([a - b for a, b in zip(on, off)])
    assert saved["documents"]["math"] > 1 and len(diff) == 3
    # the window is 16: only the last bucket (16-32) lies beyond it
    past = saved["differences"]["minus_reference"]["fwpkm"]["math"][0][2]["value"]
    assert saved["beyond"]["fwpkm"]["math"]["values"] == pytest.approx([past])
    # the whole split per seed: the member's token-weighted mean, the buckets' tokens put back together
    member = json.loads(next(folder.glob("fwpkm-seed0*.json")).read_text())["scores"]["math"]["on"]
    assert saved["whole"]["fwpkm"]["on"]["math"] == [member["mean"]]
    tokens = saved["tokens"]["math"]
    assert member["mean"] == pytest.approx(sum(m * n for m, n in zip(on, tokens)) / sum(tokens))
    assert set(saved["whole"]["attention"]) == {"off"}
    again = []
    run(load(path), say=again.append)
    assert not any("scoring" in line for line in again)  # finished variants are read back
    # a memory variant as the reference is read as it is used, writing: attention − fwpkm(on)
    folder2, against = run(load(path, overrides=["reference=fwpkm"]), say=again.append)
    assert folder2 == folder and not any("scoring" in line for line in again)  # the same members
    att, mem = saved["means"]["attention"]["math"]["off"], saved["means"]["fwpkm"]["math"]["on"]
    cells = against["differences"]["minus_reference"]["attention"]["math"][0]
    assert [c["value"] for c in cells] == pytest.approx([a - b for a, b in zip(att, mem)])


def test_variant_subset_on_the_command_line(tiny, tmp_path):
    path, _ = family(tiny, tmp_path)
    assert list(load(path, variants=["attention"]).variants) == ["attention"]
    with pytest.raises(ConfigError, match="--variants \\['mamba'\\] not among"):
        load(path, variants=["attention", "mamba"])
    with pytest.raises(ConfigError, match="reference"):
        load(path, variants=["fwpkm"])
    proc = tiny.run_cli(["eval", str(path), "--variants", "mamba"], check=False)
    assert proc.returncode == 2 and "clp eval: error" in proc.stderr and "mamba" in proc.stderr


def test_beyond_the_window_is_token_weighted_per_seed_with_a_t_interval_over_seeds():
    from experiments.studies.longctx import beyond_window

    def cells(*pairs):  # (value, tokens) per bucket
        return [{"value": v, "low": v - 1, "high": v + 1, "tokens": n} for v, n in pairs]

    seeds = [cells((9.0, 100), (-0.1, 300), (-0.3, 100)), cells((9.0, 100), (-0.2, 100), (-0.2, 100)),
             cells((9.0, 100), (-0.4, 100), (0.0, 300))]
    got = beyond_window({"fwpkm": {"law": seeds}}, edges=[0, 128, 512, 2048], window=128)["fwpkm"]["law"]
    assert got["values"] == pytest.approx([-0.15, -0.2, -0.1])  # the first bucket (inside the window) left out
    # mean -0.15, sample std 0.05, t(0.975, 2) = 4.3027
    half = 4.302653 * 0.05 / 3 ** 0.5
    assert got["mean"] == pytest.approx(-0.15) and got["t95"] == pytest.approx([-0.15 - half, -0.15 + half], rel=1e-5)
    assert beyond_window({"fwpkm": {"law": seeds}}, edges=[0, 64, 96, 100], window=128)["fwpkm"] == {}


def test_the_whole_split_block_gives_each_seeds_spread(tiny, tmp_path):
    from experiments.studies.longctx import table

    path, _ = family(tiny, tmp_path)
    exp = load(path, overrides=["seeds=[0,1,2]"])
    summary = {"buckets": [0, 16], "split": "eval", "window": 16, "seeds": [0, 1, 2], "reference": "attention",
               "domains": ["math", "code"], "documents": {"math": 1, "code": 1}, "tokens": {"math": [1], "code": [1]},
               "means": {"attention": {"math": {"off": [4.0]}, "code": {"off": [5.0]}},
                         "fwpkm": {"math": {"off": [4.0], "on": [3.0]}, "code": {"off": [5.0], "on": [4.0]}}},
               "differences": {"on_minus_off": {}, "minus_reference": {}},
               "whole": {"attention": {"off": {"math": [4.0, 4.1, 4.3], "code": [5.0, 5.0, 5.0]}},
                         "fwpkm": {"off": {"math": [4.0, 4.0, 4.0], "code": [5.2, 5.0, 5.0]},
                                   "on": {"math": [3.0, 3.1, 3.0], "code": [4.0, 4.0, 4.3]}}}}
    text = table(exp, summary)
    attention = next(line for line in text.splitlines() if line.strip().startswith("attention writes off")
                     and "(" in line)
    # math 4.133 (range 0.300), code 5.000 (0.000), domain means 4.5 / 4.55 / 4.65: 4.567 (0.150)
    assert "4.133 (0.300)" in attention and "5.000 (0.000)" in attention and "4.567 (0.150)" in attention
    on = next(line for line in text.splitlines() if line.strip().startswith("fwpkm writes on") and "(" in line)
    assert "3.033 (0.100)" in on and "4.100 (0.300)" in on and "3.567 (0.150)" in on  # 3.5 / 3.55 / 3.65
    assert "the base-to-base spread" in text


def test_doc_reads_each_document_from_the_base_memory(tiny_base):
    """Setting "doc": a loop that reads every document of every segment on its own, from the
    base's memory, gives its sums; it differs from "on" where a segment holds several documents."""
    from experiments.setup import build_model
    from experiments.studies.longctx import document_pieces

    assert document_pieces(torch.tensor([False, False, True, False, True])) == [(0, 2), (2, 4), (4, 5)]
    assert document_pieces(torch.tensor([True, False, False])) == [(0, 3)]
    setup = tiny_base.setup
    weights = torch.load(tiny_base.path, weights_only=True)["model"]
    scores = score(setup, weights, "eval", [0, 4, 16, 32], ["off", "on", "doc"])
    model = build_model(setup.model_config, 0, setup.config.pretrain.fwpkm)
    model.load_state_dict(weights)
    model.eval()
    memory = model.snapshot_memory()
    model.set_writes(True)
    several = False
    for name, data in setup.scenario.domains.items():
        seg = data.splits["eval"].segments
        total, n = 0.0, 0
        for i in range(len(seg)):
            b = seg[i]
            starts = [t for t in range(1, len(b["doc_start"])) if b["doc_start"][t]]
            several |= bool(starts)
            for a, e in zip([0] + starts, starts + [len(b["doc_start"])]):
                model.restore_memory(memory)
                with torch.no_grad():
                    logits = model(b["input_ids"][None, a:e])
                y = b["targets"][a:e]
                keep = y != -100
                total += float(torch.nn.functional.cross_entropy(logits[0][keep].float(), y[keep], reduction="sum"))
                n += int(keep.sum())
        model.restore_memory(memory)
        got = scores[name]["doc"]
        assert np.array(got["counts"]).sum() == n
        assert np.array(got["sums"]).sum() == pytest.approx(total, rel=1e-5)
    assert several  # the tiny stream packs several documents into a segment somewhere
    assert any(not np.allclose(scores[d]["doc"]["sums"], scores[d]["on"]["sums"]) for d in scores)
