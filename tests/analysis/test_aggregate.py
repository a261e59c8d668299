"""Mean ± std over seeds: every matrix entry and headline metric, the t-interval over runs and each
experience's gain, hand-computed."""
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


# Student's t, 97.5th percentile, from any printed table: 1 and 2 degrees of freedom.
T_975 = {1: 12.7062, 2: 4.3027}


def test_t_interval_over_runs_and_each_experiences_gain():
    agg = aggregate([run(A, 0), run(B, 1)], ["base 0", "base 1"])
    f = agg["metrics"]["average_forgetting"]  # values 0.5, 0.2: half-width t · s / √n
    half = T_975[1] * (0.3 / math.sqrt(2)) / math.sqrt(2)
    assert f["t95"] == pytest.approx([0.35 - half, 0.35 + half], abs=1e-4)
    assert f["cv"] == pytest.approx((0.3 / math.sqrt(2)) / 0.35)
    # G_1 (math) = 4.0 − 3.0 and 4.2 − 3.4; G_2 (law) = 5.0 − 4.0 and 5.2 − 4.4
    g = agg["experience_gains"]
    assert [e["experience"] for e in g] == ["math", "law"]
    assert g[0]["values"] == pytest.approx([1.0, 0.8]) and g[1]["values"] == pytest.approx([1.0, 0.8])
    assert g[0]["mean"] == pytest.approx(0.9) and g[0]["cv"] == pytest.approx(0.2 / math.sqrt(2) / 0.9)
    text = format_aggregate(agg)
    assert "1 math" in text and "16 %" in text  # cv 15.7 %
    # three runs: 2 degrees of freedom, and a C with a larger gain widens the interval
    C = [[4.0, 5.0], [2.5, 5.5], [3.0, 3.5]]
    three = aggregate([run(A, 0), run(B, 1), run(C, 2)])["experience_gains"][0]
    values = np.array([1.0, 0.8, 1.5])
    half = T_975[2] * values.std(ddof=1) / math.sqrt(3)
    assert three["t95"] == pytest.approx([values.mean() - half, values.mean() + half], abs=1e-4)


def test_one_run_has_no_spread_rather_than_zero():
    agg = aggregate([run(A)])
    assert np.isnan(agg["matrix_std"]).all() and math.isnan(agg["metrics"]["average_final"]["std"])
    assert all(math.isnan(v) for v in agg["experience_gains"][0]["t95"])
    text = format_aggregate(agg)
    assert "nan" not in text and "4.000 ± n/a (1 seed)" in text and "+1.0000 ± n/a (1 seed)" in text
    assert "retention_after_2                  n/a (needs ≥ 3 experiences and a gain to retain)" in text


def test_runs_that_do_not_match_or_did_not_finish_are_refused():
    with pytest.raises(ValueError, match="another matrix layout"):
        aggregate([run(A), run(B, 1, experiences=("law", "math"))])
    unfinished = [[4.0, 5.0], [3.0, 5.5], [math.nan, math.nan]]
    with pytest.raises(ValueError, match="run 1 is not complete"):
        aggregate([run(A), run(unfinished, 1)])
    with pytest.raises(ValueError, match="no runs"):
        aggregate([])
