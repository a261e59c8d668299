"""`clp bench device --dry-run`: the prepared GPU check's code, run on the CPU at toy sizes, so
that the session that is lent a GPU runs a script known to work (issue 23)."""
import re

import pytest
import torch

from experiments.cli import main as cli_main
from experiments.studies import bench_device


def test_the_dry_run_prints_every_row_with_measured_values(capsys):
    assert cli_main(["bench", "device", "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert list(rows) == ["tests", "reference", "layer", "layer×4", "layer×8", "step", "step×4", "pretrain"]
    assert "B = 8:" in rows["layer×4"] and "B = 16:" in rows["layer×8"] and "B = 8:" in rows["step×4"]
    error = float(re.search(r"max \|Δ\| (\S+)", rows["reference"]).group(1))
    assert 0 < error <= 1e-4  # float32 differs from float64, within the bar
    assert float(re.search(r"ours ([\d,]+) tok/s", rows["layer"]).group(1).replace(",", "")) > 0
    fw, att, ratio = re.search(r"([\d,.]+) / ([\d,.]+) ms = ([\d.]+)×", rows["step"]).groups()
    assert float(ratio) == pytest.approx(float(fw.replace(",", "")) / float(att.replace(",", "")), abs=0.01)


def test_the_reference_comparison_sees_a_less_exact_layer():
    """The reference row can fail: the same layer in bfloat16 (8 bits of mantissa) is far
    outside the bar that float32 meets."""
    assert bench_device.reference_error(torch.device("cpu")) <= 1e-4
    assert bench_device.reference_error(torch.device("cpu"), torch.bfloat16) > 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_full_check_is_refused_in_one_line(capsys):
    assert cli_main(["bench", "device"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0] and "--dry-run" in err[0]
