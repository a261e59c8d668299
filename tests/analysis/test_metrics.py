import math

import numpy as np
import pytest

from analysis import metrics
from analysis.table import format_table
from cl_platform.results import ResultsMatrix, RunResults

NAN = math.nan

# Loss matrix, order a → b → c. Domain a improves while b trains (row 2), so its best value
# is not the one right after its own training: forgetting and -BWT differ for a.
LOSS = ResultsMatrix(
    domains=["a", "b", "c"],
    experiences=["a", "b", "c"],
    values=np.array(
        [
            [4.0, 5.0, 6.0],  # before any experience
            [2.0, 4.5, 6.5],  # after a
            [1.5, 2.5, 5.5],  # after b
            [3.5, 3.0, 2.0],  # after c
        ]
    ),
)


def test_hand_computed_loss_matrix():
    assert metrics.last_row(LOSS) == 3
    assert metrics.average_score(LOSS) == pytest.approx((3.5 + 3.0 + 2.0) / 3)
    # F_j = R[T, j] - min over rows first(j)..T-1; c was trained by the last experience.
    assert metrics.forgetting_per_domain(LOSS) == pytest.approx({"a": 3.5 - 1.5, "b": 3.0 - 2.5})
    assert metrics.average_forgetting(LOSS) == pytest.approx(1.25)
    # BWT_j = R[last(j), j] - R[T, j].
    bwt = {"a": 2.0 - 3.5, "b": 2.5 - 3.0}
    assert metrics.backward_transfer_per_domain(LOSS) == pytest.approx(bwt)
    assert metrics.backward_transfer(LOSS) == pytest.approx(-1.0)
    # FWT_j = R[0, j] - R[first(j) - 1, j]; a is first and has no earlier experience.
    fwt = {"b": 5.0 - 4.5, "c": 6.0 - 5.5}
    assert metrics.forward_transfer_per_domain(LOSS) == pytest.approx(fwt)
    assert metrics.forward_transfer(LOSS) == pytest.approx(0.5)
    # P_t = R[t-1, d_t] - R[t, d_t].
    gains = [4.0 - 2.0, 4.5 - 2.5, 5.5 - 2.0]
    assert metrics.plasticity_per_experience(LOSS) == pytest.approx(gains)
    assert metrics.plasticity(LOSS) == pytest.approx(2.5)


def test_recurring_domain():
    # Order a → b → a → c: a's forgetting looks back to its first training (row 1), its BWT to
    # its most recent one (row 3).
    m = ResultsMatrix(
        ["a", "b", "c"],
        ["a", "b", "a", "c"],
        np.array(
            [
                [5.0, 5.0, 5.0],
                [2.0, 5.5, 5.0],
                [4.0, 3.0, 5.0],
                [2.5, 3.6, 5.0],
                [2.8, 3.7, 2.0],
            ]
        ),
    )
    assert metrics.forgetting_per_domain(m) == pytest.approx({"a": 2.8 - 2.0, "b": 3.7 - 3.0})
    bwt = {"a": 2.5 - 2.8, "b": 3.0 - 3.7}
    assert metrics.backward_transfer_per_domain(m) == pytest.approx(bwt)
    assert metrics.forward_transfer_per_domain(m) == pytest.approx({"b": 5.0 - 5.5, "c": 5.0 - 5.0})
    assert metrics.plasticity_per_experience(m) == pytest.approx([3.0, 2.5, 1.5, 3.0])


def test_domain_retrained_by_last_experience_has_no_forgetting():
    m = ResultsMatrix(["a", "b"], ["a", "b", "a"], np.array([[5, 5], [3, 5.5], [4, 3], [2.5, 3.6]]))
    assert metrics.forgetting_per_domain(m) == pytest.approx({"b": 0.6})
    assert metrics.backward_transfer_per_domain(m) == pytest.approx({"b": -0.6})


def test_partial_matrix_uses_completed_rows():
    m = ResultsMatrix(
        ["a", "b"], ["a", "b", "a"], np.array([[5, 5], [3, 5.5], [4, 3], [NAN, NAN]])
    )
    assert metrics.last_row(m) == 2
    assert metrics.average_score(m) == pytest.approx(3.5)
    assert metrics.forgetting_per_domain(m) == pytest.approx({"a": 1.0})
    assert metrics.backward_transfer(m) == pytest.approx(-1.0)
    assert metrics.plasticity_per_experience(m) == pytest.approx([2.0, 2.5])

    only_baseline = ResultsMatrix(["a"], ["a"], np.array([[5.0], [NAN]]))
    assert metrics.forgetting_per_domain(only_baseline) == {}
    assert math.isnan(metrics.average_forgetting(only_baseline))
    assert math.isnan(metrics.plasticity(only_baseline))

    nothing = ResultsMatrix(["a"], ["a"], np.array([[NAN], [NAN]]))
    with pytest.raises(ValueError, match="row 0"):
        metrics.summary(nothing)


def test_accuracy_orientation_mirrors_loss():
    # Same matrix as LOSS with the sign flipped and higher-is-better: every transfer metric is
    # unchanged; only the average score flips.
    acc = ResultsMatrix(LOSS.domains, LOSS.experiences, -LOSS.values, "accuracy", False)
    for fn in (
        metrics.forgetting_per_domain,
        metrics.backward_transfer_per_domain,
        metrics.forward_transfer_per_domain,
        metrics.plasticity_per_experience,
    ):
        assert fn(acc) == pytest.approx(fn(LOSS))
    assert metrics.average_score(acc) == pytest.approx(-metrics.average_score(LOSS))


def test_hand_computed_accuracy_matrix():
    acc = ResultsMatrix(
        ["a", "b"],
        ["a", "b"],
        np.array([[0.1, 0.2], [0.9, 0.3], [0.6, 0.8]]),
        metric="accuracy",
        lower_is_better=False,
    )
    assert metrics.forgetting_per_domain(acc) == pytest.approx({"a": 0.9 - 0.6})
    assert metrics.backward_transfer(acc) == pytest.approx(0.6 - 0.9)
    assert metrics.forward_transfer(acc) == pytest.approx(0.3 - 0.2)
    assert metrics.plasticity_per_experience(acc) == pytest.approx([0.8, 0.5])


def _accuracy_matrix(rng: np.random.Generator, n: int, peak_after_training: bool) -> np.ndarray:
    """(n + 1, n) accuracies, domain k trained by experience k + 1; optionally each column is at
    its best right after training and only decays afterwards."""
    acc = rng.uniform(0.0, 0.3, size=(n + 1, n))
    for k in range(n):
        acc[k + 1, k] = rng.uniform(0.7, 1.0)
        for t in range(k + 2, n + 1):
            decayed = acc[t - 1, k] - rng.uniform(0.0, 0.2)
            acc[t, k] = decayed if peak_after_training else rng.uniform(0.0, 1.0)
    return acc


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_avalanche_functional_definitions(seed):
    functional = pytest.importorskip("avalanche.evaluation.functional")
    from avalanche.evaluation.metrics.forgetting_bwt import BWT, forgetting_to_bwt

    rng = np.random.default_rng(seed)
    n = 4
    for peak in (True, False):
        values = _accuracy_matrix(rng, n, peak)
        ours = ResultsMatrix(
            [f"d{k}" for k in range(n)], [f"d{k}" for k in range(n)], values, "accuracy", False
        )
        # Avalanche's matrix has no before-training row: its row k is our row k + 1, and
        # boundary_indices[k] = k (experience k learned at time k).
        theirs = functional.forgetting(values[1:])
        final = theirs[-1]
        bwt = metrics.backward_transfer_per_domain(ours)
        assert list(bwt) == [f"d{k}" for k in range(n - 1)]
        for k in range(n - 1):
            assert bwt[f"d{k}"] == pytest.approx(forgetting_to_bwt(float(final[k])))

        # Avalanche's standalone BWT: initial = right after training, last = final row.
        standalone = BWT()
        for k in range(n - 1):
            standalone.update(k, values[k + 1, k], initial=True)
            standalone.update(k, values[n, k])
        assert [bwt[f"d{k}"] for k in range(n - 1)] == pytest.approx(
            [standalone.result()[k] for k in range(n - 1)]
        )

        forgetting = metrics.forgetting_per_domain(ours)
        if peak:
            ours_f = [forgetting[f"d{k}"] for k in range(n - 1)]
            assert ours_f == pytest.approx(list(final[: n - 1]))
            assert metrics.average_forgetting(ours) == pytest.approx(float(np.mean(final[: n - 1])))
        else:
            # Best-earlier-value forgetting is never below Avalanche's after-training version.
            assert all(forgetting[f"d{k}"] >= final[k] - 1e-12 for k in range(n - 1))


def test_area_under_curve():
    assert metrics.area_under_curve([(0, 4.0), (10, 2.0)]) == pytest.approx(3.0)
    assert metrics.area_under_curve([(0, 4.0), (10, 2.0), (30, 2.0)]) == pytest.approx(
        (10 * 3.0 + 20 * 2.0) / 30
    )
    assert metrics.area_under_curve([(5, 2.5)]) == 2.5
    assert metrics.area_under_curve([(5, 2.0), (5, 3.0)]) == 2.5
    assert math.isnan(metrics.area_under_curve([]))
    # Two evaluations at one step (end of one experience, start of the next) add no area.
    assert metrics.area_under_curve([(0, 4.0), (10, 2.0), (10, 3.0), (20, 3.0)]) == pytest.approx(
        (10 * 3.0 + 10 * 3.0) / 20
    )


def _run() -> RunResults:
    return RunResults(
        matrix=LOSS,
        config_hash="abc",
        seed=0,
        mode="fast",
        memory_policy="persist",
        strategy="naive",
        curves={"a": [(0, 4.0), (10, 2.0)], "b": [(0, 5.0), (10, 5.0)]},
    )


def test_summary():
    s = metrics.summary(_run())
    assert s == pytest.approx(
        {
            "metric": "loss",
            "lower_is_better": True,
            "experiences_done": 3,
            "experiences_total": 3,
            "average_final": 8.5 / 3,
            "average_forgetting": 1.25,
            "backward_transfer": -1.0,
            "forward_transfer": 0.5,
            "plasticity": 2.5,
            "area_under_curve": (3.0 + 5.0) / 2,
        }
    )
    assert "area_under_curve" not in metrics.summary(LOSS)


def test_format_table():
    m = ResultsMatrix(
        ["math", "law"],
        ["math", "law", "math"],
        np.array([[3.21, 3.4], [2.1, 3.5], [2.6, 2.2], [NAN, NAN]]),
    )
    assert format_table(_run()) == format_table(LOSS)
    assert format_table(m, precision=2).splitlines() == [
        "loss (lower is better) math   law",
        "0 before               3.21  3.40",
        "1 math                 2.10* 3.50",
        "2 law                  2.60  2.20*",
        "3 math                    -*    -",
    ]
