"""Gain along the curve during a domain's own experience, on hand-made curves."""
import numpy as np
import pytest

from analysis.curves import fraction_reached, gain_curve
from cl_platform.results import ResultsMatrix, RunResults


def results(lower_is_better=True) -> RunResults:
    matrix = ResultsMatrix(domains=["a", "b"], experiences=["a", "b"], lower_is_better=lower_is_better,
                           values=np.array([[5.0, 6.0], [4.6, 6.1], [4.9, 5.7]]))
    curves = {
        # a: 5.0 at the start, falls during experience 1 (steps 0..8), rises while b trains.
        "a": [[0, 5.0], [4, 4.7], [8, 4.6], [8, 4.6], [12, 4.8], [16, 4.9]],
        # b: hurt by a's experience (6.0 -> 6.2), then falls below its start during its own.
        "b": [[0, 6.0], [4, 6.1], [8, 6.2], [8, 6.2], [12, 5.85], [16, 5.8]],
    }
    return RunResults(matrix=matrix, config_hash="h", seed=0, mode="fast", memory_policy="frozen",
                      strategy="naive", curves=curves, row_steps={"0": 0, "1": 8, "2": 16})


def same(curve, expected) -> bool:
    return [s for s, _ in curve] == [s for s, _ in expected] and \
        [g for _, g in curve] == pytest.approx([g for _, g in expected])


def test_gain_against_the_domains_first_curve_point_in_experience_steps():
    r = results()
    assert same(gain_curve(r, 1), [(0, 0.0), (4, 0.3), (8, 0.4)])
    # Experience 2 starts 0.2 worse than before any experience (what a's experience did to b).
    assert same(gain_curve(r, 2), [(0, -0.2), (4, 0.15), (8, 0.2)])


def test_fraction_of_the_final_gain_reached():
    r = results()
    assert fraction_reached(gain_curve(r, 1)) == {0.5: 4, 0.9: 8}
    assert fraction_reached(gain_curve(r, 2), (0.5, 1.0)) == {0.5: 4, 1.0: 8}
    assert fraction_reached([(0, 0.0), (4, -0.1)]) == {0.5: None, 0.9: None}  # no gain to reach


def test_higher_is_better_scores_flip_the_sign():
    acc = results(lower_is_better=False)
    assert same(gain_curve(acc, 1), [(0, 0.0), (4, -0.3), (8, -0.4)])


def test_a_run_without_row_steps_is_refused_by_name():
    r = results()
    r.row_steps = {"0": 0}
    with pytest.raises(ValueError, match="row 1 has no recorded step"):
        gain_curve(r, 1)
    with pytest.raises(ValueError, match="experience 3 is not in 1..2"):
        gain_curve(results(), 3)
