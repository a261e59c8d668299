"""`clp bench speed --dry-run`: the GPU speed check's stages on the CPU at toy sizes, so that the
session that is lent a GPU runs a script known to work, and a failed or slow stage costs only
itself (issue 52, item 4)."""
import json
import math

import pytest
import torch

from experiments.cli import main as cli_main
from experiments.studies import gpu_speed_check


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run (~40 s on 2 cores) in which the env stage is made to raise and the kernels
    stage gets a cap it cannot meet; the other four stages run in full."""
    out = tmp_path_factory.mktemp("speed")
    assert gpu_speed_check.main(dry_run=True, out=str(out), fail="env", caps={"kernels": 1e-6}) == 0
    return out, json.loads((out / gpu_speed_check.JSON_NAME).read_text())


def test_every_stage_is_in_the_json_and_the_table(dry_run):
    out, doc = dry_run
    assert list(doc["stages"]) == list(gpu_speed_check.STAGES)
    assert doc["dry_run"] is True and doc["size"]["subkeys"] == 16
    table = (out / gpu_speed_check.TABLE_NAME).read_text()
    for name in gpu_speed_check.STAGES:
        assert any(line.split()[:1] == [name] for line in table.splitlines()), name


def test_a_stage_that_raises_is_recorded_and_the_later_stages_still_run(dry_run):
    _, doc = dry_run
    env = doc["stages"]["env"]
    assert env["status"] == "error" and env["error"] == "RuntimeError: this stage was made to fail (fail='env')"
    assert [doc["stages"][s]["status"] for s in ("syncs", "layer", "step", "reference")] == ["ok"] * 4


def test_the_time_cap_stops_a_stage_with_its_reason(dry_run):
    _, doc = dry_run
    kernels = doc["stages"]["kernels"]
    assert kernels["status"] == "capped" and kernels["error"].startswith("cap 1e-06 s reached")
    assert kernels["cap_s"] == 1e-6


def test_the_core_never_syncs_and_the_chunked_call_once(dry_run):
    syncs = dry_run[1]["stages"]["syncs"]["results"]
    assert syncs["syncs_core_nograd"] == 0 and syncs["syncs_core_train"] == 0
    assert syncs["syncs_chunked_nograd"] == 1 and syncs["syncs_layer_train"] == 1  # the end-of-call check


def test_layer_and_step_rows_are_measured(dry_run):
    _, doc = dry_run
    layer = doc["stages"]["layer"]["results"]
    for B in (2, 8):  # the toy batch and 4 times it (4 and 16 at full size)
        for path in ("layer_eager", "core_eager", "core_compiled"):
            assert layer[f"B{B}_{path}_tok_s"] > 0
        assert layer[f"B{B}_compile_s"] > 0
    step = doc["stages"]["step"]["results"]
    for mode in ("eager", "compiled"):
        assert step[mode]["ratio"] == pytest.approx(step[mode]["fwpkm_ms"] / step[mode]["attention_ms"])


def test_reference_errors_are_finite_and_within_the_bar(dry_run):
    ref = dry_run[1]["stages"]["reference"]["results"]
    for path in ("eager", "compiled"):
        errors = ref[path]
        assert set(errors) >= {"vhat", "keys", "values", "read_counts", "dq", "dv", "dg", "max"}
        assert all(math.isfinite(e) for e in errors.values()), errors
    assert 0 < ref["eager"]["max"] <= 1e-4  # float32 differs from float64, within the bar
    assert ref["eager"]["read_counts"] == 0.0  # the same slots picked


def test_a_result_is_in_the_json_as_soon_as_it_is_put(tmp_path):
    """A run killed inside a stage keeps what that stage had measured."""
    report = gpu_speed_check.Report(tmp_path, {"check": "test"})
    stage = gpu_speed_check.Stage("layer", 10, on_put=lambda st: report.add(st, "running", 1.0, None))
    stage.put("B4_core_eager_tok_s", 123.0)
    doc = json.loads((tmp_path / gpu_speed_check.JSON_NAME).read_text())
    assert doc["stages"]["layer"]["status"] == "running"
    assert doc["stages"]["layer"]["results"] == {"B4_core_eager_tok_s": 123.0}
    assert "B4_core_eager_tok_s: 123" in (tmp_path / gpu_speed_check.TABLE_NAME).read_text()


def test_bad_arguments_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown stage"):
        gpu_speed_check.main(dry_run=True, out=str(tmp_path), caps={"warmup": 1})
    with pytest.raises(ValueError, match="not a stage"):
        gpu_speed_check.main(dry_run=True, out=str(tmp_path), fail="nope")
    with pytest.raises(ValueError, match="seconds > 0"):
        gpu_speed_check.main(dry_run=True, out=str(tmp_path), caps={"layer": 0})
    (tmp_path / "file").write_text("")
    assert cli_main(["bench", "speed", "--dry-run", "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_full_check_is_refused_in_one_line(tmp_path, capsys):
    assert cli_main(["bench", "speed", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0] and "--dry-run" in err[0]
