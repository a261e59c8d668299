"""`clp repeat` (verbatim recall beyond the attention window): the episode layout, the final copy's
loss against a plain cross-entropy, the structural zero beyond attention's reach (which a leak in
the window, a memory that writes when told not to, or a control that differs from the repeat in
more than the first passage would break), and the statistics over seeds by hand."""
import json
import math

import pytest
import torch
import torch.nn.functional as F
import yaml

from cl_platform.check import ConfigError
from experiments.studies.repeat import episode_pair, final_copy_loss, load, run, summarise


def test_episode_pair_is_p_f_p_against_q_f_p():
    first, second = torch.arange(100, 120), torch.arange(200, 220)
    rep, con = episode_pair(first, second, passage=4, gap=3)
    assert rep.tolist() == [100, 101, 102, 103, 200, 201, 202, 100, 101, 102, 103]
    assert con.tolist() == [104, 105, 106, 107, 200, 201, 202, 100, 101, 102, 103]
    rep, con = episode_pair(first, second, passage=4, gap=0)
    assert rep.tolist() == [100, 101, 102, 103] * 2 and con.tolist() == [104, 105, 106, 107, 100, 101, 102, 103]


def test_final_copy_loss_is_the_cross_entropy_of_the_copys_later_tokens():
    class Table(torch.nn.Module):  # logits at t depend on the token at t only
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(50, 50, generator=torch.Generator().manual_seed(0)))

        def forward(self, idx):
            return self.w[idx]

    model, ids = Table(), torch.tensor([3, 7, 1, 4, 9, 2, 8])
    want = F.cross_entropy(model.w[ids[3:6]], ids[4:7])  # passage 4: predict ids[4..6] from ids[3..5]
    assert final_copy_loss(model, ids, 4) == pytest.approx(float(want), rel=1e-6)


def write(tiny, tmp_path, **fields):
    base = tiny.config(tmp_path / "base.yaml", model={"window": 8})  # 2 layers: reach 2 x 7 = 14 tokens
    family = {"base": "base.yaml", "variants": {"attention": {"fwpkm_layers": []}, "fwpkm": {}}}
    (tmp_path / "family.yaml").write_text(yaml.safe_dump(family), encoding="utf-8")
    data = {"family": "family.yaml", "reference": "attention", "passage": 4, "gaps": [0, 16], "episodes": 5,
            "bootstrap_samples": 50, "runs_root": str(tiny.runs), **fields}
    path = tmp_path / "repeat.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_beyond_the_reach_only_a_writing_memory_recalls(tiny, tmp_path):
    """Gap 16 ≥ the reach (14): the twin and the FwPKM with writes off read the final copy
    identically after P and after Q (recall 0 up to float rounding, every episode); writing, the
    memory carries P across. Gap 0 (P inside the 8-token window): attention sees the first copy."""
    said = []
    folder, summary = run(load(write(tiny, tmp_path)), say=said.append)
    member = json.loads((folder / "fwpkm-seed0.json").read_text())
    assert member["reach"] == 14 and member["window"] == 8
    for d in summary["domains"]:
        for variant, setting in (("attention", "off"), ("fwpkm", "off")):
            cell = json.loads((folder / f"{variant}-seed0.json").read_text())["scores"][d][setting]["16"]
            assert len(cell["repeat"]) == 5
            assert max(abs(c - r) for c, r in zip(cell["control"], cell["repeat"])) < 1e-5
            assert summary["recall"][variant][setting]["16"][d]["mean"] == pytest.approx(0, abs=1e-5)
        writing = member["scores"][d]["on"]["16"]
        assert max(abs(c - r) for c, r in zip(writing["control"], writing["repeat"])) > 1e-3
        near = json.loads((folder / "attention-seed0.json").read_text())["scores"][d]["off"]["0"]
        assert max(abs(c - r) for c, r in zip(near["control"], near["repeat"])) > 1e-3
    text = (folder / "table.txt").read_text()
    assert "gap 16 (beyond the reach of attention)" in text and "gap 0 (the first copy within the window)" in text
    assert "fwpkm writes on" in text and "Δ fwpkm−attention" in text
    again = []
    run(load(write(tiny, tmp_path)), say=again.append)
    assert not any("repeat/control pairs" in line for line in again)  # finished members are read back


def test_statistics_by_hand():
    """One seed: the episodes' mean; two seeds: the mean of the seeds' means with a t-interval
    (t 0.975 at 1 df = 12.706); Δ paired by seed."""
    class Exp:
        variants, reference, seeds, gaps = ["a", "b"], "a", [0, 1], [5]
        passage, episodes, split, bootstrap_samples = 4, 2, "eval", 50

    def member(v, s, rec):
        return {"variant": v, "seed": s, "window": 8, "reach": 14,
                "scores": {"math": {"off": {"5": {"control": [3.0 + x for x in rec], "repeat": [3.0, 3.0]}}}}}

    results = [member("a", 0, [0.0, 0.0]), member("a", 1, [0.0, 0.2]),
               member("b", 0, [0.5, 0.3]), member("b", 1, [0.1, 0.3])]
    s = summarise(Exp, results)
    b = s["recall"]["b"]["off"]["5"]["math"]
    assert b["values"] == pytest.approx([0.4, 0.2]) and b["mean"] == pytest.approx(0.3)
    half = 12.706 * math.sqrt(0.02) / math.sqrt(2)
    assert b["t95"] == pytest.approx([0.3 - half, 0.3 + half], rel=1e-4)
    d = s["minus_reference"]["b"]["5"]["math"]
    assert d["values"] == pytest.approx([0.4, 0.1])


def test_a_memory_reference_is_compared_writing():
    """With a reference that has an FwPKM, Δ is variant(on) − reference(on), not − reference(off)."""
    class Exp:
        variants, reference, seeds, gaps = ["plain", "knob"], "plain", [0], [5]
        passage, episodes, split, bootstrap_samples = 4, 2, "eval", 50

    def member(v, off, on):
        cell = lambda rec: {"5": {"control": [3.0 + x for x in rec], "repeat": [3.0, 3.0]}}
        return {"variant": v, "seed": 0, "window": 8, "reach": 14,
                "scores": {"math": {"off": cell(off), "on": cell(on)}}}

    s = summarise(Exp, [member("plain", [0.0, 0.0], [0.6, 0.8]), member("knob", [0.0, 0.0], [0.5, 0.5])])
    assert s["minus_reference"]["knob"]["5"]["math"]["values"] == pytest.approx([0.5 - 0.7])


@pytest.mark.parametrize("fields, message", [
    ({"passage": 20}, "passage"),
    ({"gaps": [0, 40]}, "gaps"),
    ({"gaps": [0, 28]}, "longer than the 32-token segments"),
    ({"reference": "mamba"}, "reference"),
    ({"variants": ["attention", "mamba"]}, "mamba"),
    ({"gaps": []}, "gaps"),
    ({"episodz": 3}, "episodz"),
])
def test_bad_input_is_named_before_any_pretraining(tiny, tmp_path, fields, message):
    runs = tmp_path / "fresh-runs"
    path = write(tiny, tmp_path, runs_root=str(runs), **fields)
    with pytest.raises((ConfigError, ValueError), match=message):
        run(load(path))
    assert not runs.exists()


def test_command_line(tiny, tmp_path):
    path = write(tiny, tmp_path)
    proc = tiny.run_cli(["repeat", str(path), "--variants", "mamba"], check=False)
    assert proc.returncode == 2 and "mamba" in proc.stderr
