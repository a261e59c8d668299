"""Mean ± std over seeds: every matrix entry and headline metric, hand-computed."""
import math

import numpy as np
import pytest

from analysis.aggregate import aggregate, format_aggregate, mean_matrix
from analysis.metrics import average_forgetting
from cl_platform.results import ResultsMatrix, RunResults


def run(values, seed=0, experiences=("math", "law")) -> RunResults:
    matrix = ResultsMatrix(["math", "law"], list(experiences), values)
    return RunResults(matrix=matrix, config_hash=f"h{seed}", seed=seed, mode="fast", memory_policy="frozen",
                      strategy="naive", versions={})


A = [[4.0, 5.0], [3.0, 5.5], [3.5, 4.0]]
B = [[4.2, 5.2], [3.4, 5.3], [3.6, 4.4]]


def test_mean_and_sample_std_of_every_entry_and_metric():
    agg = aggregate([run(A, 0), run(B, 1)], ["seed 0", "seed 1"])
    np.testing.assert_allclose(agg["matrix_mean"], (np.array(A) + np.array(B)) / 2)
    # two values: sample std = |a − b| / √2
    np.testing.assert_allclose(agg["matrix_std"], np.abs(np.array(A) - np.array(B)) / math.sqrt(2))
    # forgetting of math: 3.5 − 3.0 = 0.5 and 3.6 − 3.4 = 0.2
    forgetting = agg["metrics"]["average_forgetting"]
    assert forgetting["values"] == pytest.approx([0.5, 0.2])
    assert forgetting["mean"] == pytest.approx(0.35) and forgetting["std"] == pytest.approx(0.3 / math.sqrt(2))
    assert average_forgetting(mean_matrix(agg)) == pytest.approx(0.35)  # linear here, so equal
    assert agg["runs"] == ["seed 0", "seed 1"] and agg["config_hashes"] == ["h0", "h1"]
    text = format_aggregate(agg)
    assert "3.550 ± 0.071" in text and "average_forgetting" in text and "+0.3500 ± 0.2121" in text


def test_one_run_has_no_spread_rather_than_zero():
    agg = aggregate([run(A)])
    assert np.isnan(agg["matrix_std"]).all() and math.isnan(agg["metrics"]["average_final"]["std"])


def test_runs_that_do_not_match_or_did_not_finish_are_refused():
    with pytest.raises(ValueError, match="another matrix layout"):
        aggregate([run(A), run(B, 1, experiences=("law", "math"))])
    unfinished = [[4.0, 5.0], [3.0, 5.5], [math.nan, math.nan]]
    with pytest.raises(ValueError, match="run 1 is not complete"):
        aggregate([run(A), run(unfinished, 1)])
    with pytest.raises(ValueError, match="no runs"):
        aggregate([])
