"""The studies' intervals against closed forms, scipy and naive references."""
import math

import numpy as np
import pytest
from scipy import stats

from analysis.intervals import (bootstrap_mean, interval_text, mean_and_std, mean_of, mean_std, paired_bootstrap,
                                wilson)


def wilson_closed_form(k, n, z=1.959963984540054):
    p = k / n
    centre = (2 * n * p + z * z) / (2 * (n + z * z))
    half = z * math.sqrt(z * z + 4 * n * p * (1 - p)) / (2 * (n + z * z))
    return centre - half, centre + half


@pytest.mark.parametrize("k, n", [(0, 100), (15, 100), (50, 100), (100, 100), (3, 7)])
def test_wilson_is_the_closed_form(k, n):
    low, high = wilson(k, n, z=1.959963984540054)
    ref = wilson_closed_form(k, n)
    assert low == pytest.approx(max(0.0, ref[0]), abs=1e-12) and high == pytest.approx(min(1.0, ref[1]), abs=1e-12)


def test_wilson_known_values():
    assert wilson(0, 100) == (0.0, pytest.approx(0.03699, abs=1e-4))   # 3.84 / 103.84
    assert wilson(15, 100) == (pytest.approx(0.0931, abs=1e-4), pytest.approx(0.2328, abs=1e-4))
    assert all(math.isnan(x) for x in wilson(0, 0))


def test_the_t_interval_over_bases_is_scipys():
    values = [0.10, 0.06, 0.11]
    got = mean_std(values)
    mean, sem = np.mean(values), stats.sem(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=sem)
    assert got["mean"] == pytest.approx(mean) and got["t95"] == pytest.approx([low, high])
    assert math.isnan(mean_std([0.3])["std"])


def test_mean_and_std_and_mean_of():
    assert mean_and_std([0.5]) == (0.5, 0.0)
    assert mean_and_std([0.5, 0.6]) == pytest.approx((0.55, math.sqrt(0.005)))
    assert mean_of([0.5, None, 0.7]) == pytest.approx(0.6) and mean_of([None]) is None


def naive_bootstrap_mean(values, samples, seed):
    rng = np.random.default_rng(seed)
    means = sorted(float(np.mean([values[i] for i in rng.integers(0, len(values), len(values))]))
                   for _ in range(samples))
    return np.quantile(means, 0.025), np.quantile(means, 0.975)


def test_bootstrap_mean_is_deterministic_covers_the_mean_and_matches_a_naive_loop():
    values = list(np.random.default_rng(3).normal(0.2, 1.0, size=40))
    a, b = bootstrap_mean(values, 500, seed=1), bootstrap_mean(values, 500, seed=1)
    assert a == b and a[0] < np.mean(values) < a[1]
    assert a == pytest.approx(naive_bootstrap_mean(values, 500, seed=1), abs=1e-12)
    assert bootstrap_mean(values, 500, seed=2) != a
    assert bootstrap_mean([0.3] * 5, 50) == pytest.approx([0.3, 0.3])


def test_paired_bootstrap_averages_each_sides_runs_and_resamples_the_episodes():
    assert paired_bootstrap([[1, 0, 1, 0]], [[1, 1, 1, 0]])["value"] == pytest.approx(0.25)
    assert paired_bootstrap([[0, 0, 0, 0]], [[1, 1, 0, 0], [1, 0, 0, 0]])["value"] == pytest.approx(0.375)
    same = paired_bootstrap([[1, 0, 1, 1]], [[1, 0, 1, 1]])
    assert same == {"value": 0.0, "low": 0.0, "high": 0.0}
    d = paired_bootstrap([[0] * 200], [[1] * 50 + [0] * 150], seed=4)
    assert d == paired_bootstrap([[0] * 200], [[1] * 50 + [0] * 150], seed=4)
    assert d["low"] <= d["value"] <= d["high"] and d["low"] == pytest.approx(0.19, abs=0.02)
    with pytest.raises(ValueError, match="4 reference episodes against 3"):
        paired_bootstrap([[1, 0, 1, 0]], [[1, 1, 1]])


def test_interval_text():
    assert interval_text(0.25, 0.125, 0.5) == "0.25 [0.12, 0.50]"
    assert interval_text(-0.1, -0.2, 0.05, "+.3f") == "-0.100 [-0.200, +0.050]"


def test_over_bases_text():
    from analysis.intervals import over_bases_text

    assert over_bases_text(None) == "n/a"
    assert over_bases_text(mean_std([0.25])) == "0.25"
    stat = mean_std([0.10, 0.20])
    assert over_bases_text(stat) == f"0.15 [{stat['t95'][0]:.2f}, {stat['t95'][1]:.2f}] (0.10 / 0.20)"
