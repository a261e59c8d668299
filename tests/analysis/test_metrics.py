import math

import numpy as np
import pytest

from analysis import metrics
from analysis.bootstrap import bootstrap
from analysis.report_comparison import columns as comparison_report_columns
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
    # G_t = R[0, d_t] - R[t, d_t].
    assert metrics.adaptation_gain_per_experience(LOSS) == pytest.approx([2.0, 2.5, 4.0])
    assert metrics.adaptation_gain(LOSS) == pytest.approx(8.5 / 3)
    # ρ_{t,u} = (R[0, d_t] - R[u, d_t]) / G_t.
    kept = metrics.retention(LOSS)
    assert list(kept) == [1, 2, 3]
    assert kept[1] == pytest.approx([(4.0 - 1.5) / 2.0, (4.0 - 3.5) / 2.0])
    assert kept[2] == pytest.approx([(5.0 - 3.0) / 2.5])
    assert kept[3] == []
    assert metrics.retention_after(LOSS, 1) == pytest.approx((1.25 + 0.8) / 2)
    assert metrics.retention_after(LOSS, 2) == pytest.approx(0.25)
    assert math.isnan(metrics.retention_after(LOSS, 3))
    with pytest.raises(ValueError, match="k >= 1"):
        metrics.retention_after(LOSS, 0)
    # Row 0 is never the best here: both forgettings agree.
    f0 = metrics.forgetting_from_best_including_row0_per_domain(LOSS)
    assert f0 == pytest.approx(metrics.forgetting_per_domain(LOSS))
    assert metrics.average_forgetting_including_row0(LOSS) == pytest.approx(1.25)


# Loss matrix, order a → b → c, where row 0 is a's best: training a never beat the base model
# (as math in experiments/LOG.md). b improves while a trains (row 1) and gets worse during its
# own experience.
ROW0_BEST = ResultsMatrix(
    domains=["a", "b", "c"],
    experiences=["a", "b", "c"],
    values=np.array(
        [
            [4.50, 5.50, 5.00],  # before any experience
            [4.75, 4.50, 5.25],  # after a
            [5.00, 5.00, 5.25],  # after b
            [5.50, 5.25, 4.50],  # after c
        ]
    ),
)


def test_row0_counts_for_forgetting_including_row0_and_adaptation_gain():
    # Best since first training: a min(4.75, 5.0) = 4.75; b 5.0 (row 1 is before b's training).
    assert metrics.forgetting_per_domain(ROW0_BEST) == pytest.approx({"a": 0.75, "b": 0.25})
    # With row 0: a's best is row 0 (4.5); b's row 0 (5.5) is worse than row 2 and row 1 is
    # still not a candidate, so b is unchanged.
    f0 = metrics.forgetting_from_best_including_row0_per_domain(ROW0_BEST)
    assert f0 == pytest.approx({"a": 5.5 - 4.5, "b": 5.25 - 5.0})
    assert metrics.average_forgetting(ROW0_BEST) == pytest.approx(0.5)
    assert metrics.average_forgetting_including_row0(ROW0_BEST) == pytest.approx(0.625)

    gains = [4.5 - 4.75, 5.5 - 5.0, 5.0 - 4.5]
    assert metrics.adaptation_gain_per_experience(ROW0_BEST) == pytest.approx(gains)
    assert metrics.adaptation_gain(ROW0_BEST) == pytest.approx(0.75 / 3)
    # b's plasticity is negative (worse than after a) though its gain against row 0 is positive.
    assert metrics.plasticity_per_experience(ROW0_BEST) == pytest.approx([-0.25, -0.5, 0.75])
    # a's gain is negative: nothing to retain, no key.
    kept = metrics.retention(ROW0_BEST)
    assert list(kept) == [2, 3]
    assert kept[2] == pytest.approx([(5.5 - 5.25) / 0.5])
    assert kept[3] == []
    assert metrics.retention_after(ROW0_BEST, 1) == pytest.approx(0.5)
    assert math.isnan(metrics.retention_after(ROW0_BEST, 2))


def test_plasticity_counts_recovery_from_interference_adaptation_gain_does_not():
    # math → law → math: the first math experience changes nothing, law raises math's loss by 0.5,
    # the second math experience only undoes that.
    m = ResultsMatrix(
        ["math", "law"],
        ["math", "law", "math"],
        np.array([[3.0, 5.0], [3.0, 5.0], [3.5, 4.0], [3.0, 4.25]]),
    )
    assert metrics.plasticity_per_experience(m) == pytest.approx([0.0, 1.0, 0.5])
    assert metrics.plasticity(m) == pytest.approx(0.5)
    assert metrics.adaptation_gain_per_experience(m) == pytest.approx([0.0, 1.0, 0.0])
    assert metrics.adaptation_gain(m) == pytest.approx(1.0 / 3)
    # Only law (experience 2) gained against row 0; 0.75 of its gain is left one experience later.
    assert metrics.retention(m) == {2: [pytest.approx(0.75)]}


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
    # G_t against row 0: a's second experience (row 3) carries what its first one left.
    assert metrics.adaptation_gain_per_experience(m) == pytest.approx([3.0, 2.0, 2.5, 3.0])
    assert metrics.adaptation_gain(m) == pytest.approx(2.625)
    # Experience 1 (a) is followed through b and a's own second experience (row 3), which counts
    # like any later experience.
    kept = metrics.retention(m)
    assert list(kept) == [1, 2, 3, 4]
    assert kept[1] == pytest.approx([1.0 / 3.0, 2.5 / 3.0, 2.2 / 3.0])
    assert kept[2] == pytest.approx([1.4 / 2.0, 1.3 / 2.0])
    assert kept[3] == pytest.approx([2.2 / 2.5])
    assert kept[4] == []
    assert metrics.retention_after(m, 1) == pytest.approx((1.0 / 3.0 + 0.7 + 0.88) / 3)
    assert metrics.retention_after(m, 2) == pytest.approx((2.5 / 3.0 + 0.65) / 2)
    assert metrics.retention_after(m, 3) == pytest.approx(2.2 / 3.0)
    assert metrics.forgetting_from_best_including_row0_per_domain(m) == pytest.approx(
        {"a": 0.8, "b": 0.7}
    )


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
    # Measured up to row 2: the unfinished third experience (a again) has no gain, and a's first
    # gain is followed through row 2 only.
    assert metrics.adaptation_gain_per_experience(m) == pytest.approx([2.0, 2.0])
    assert metrics.retention(m) == {1: [pytest.approx(0.5)], 2: []}
    assert metrics.retention_after(m, 1) == pytest.approx(0.5)
    assert math.isnan(metrics.retention_after(m, 2))
    assert metrics.forgetting_from_best_including_row0_per_domain(m) == pytest.approx({"a": 1.0})
    assert metrics.summary(m)["experiences_done"] == 2

    only_baseline = ResultsMatrix(["a"], ["a"], np.array([[5.0], [NAN]]))
    assert metrics.forgetting_per_domain(only_baseline) == {}
    assert metrics.forgetting_from_best_including_row0_per_domain(only_baseline) == {}
    assert math.isnan(metrics.average_forgetting(only_baseline))
    assert math.isnan(metrics.average_forgetting_including_row0(only_baseline))
    assert math.isnan(metrics.plasticity(only_baseline))
    assert metrics.adaptation_gain_per_experience(only_baseline) == []
    assert math.isnan(metrics.adaptation_gain(only_baseline))
    assert metrics.retention(only_baseline) == {}
    assert math.isnan(metrics.retention_after(only_baseline, 1))

    nothing = ResultsMatrix(["a"], ["a"], np.array([[NAN], [NAN]]))
    with pytest.raises(ValueError, match="row 0"):
        metrics.summary(nothing)


@pytest.mark.parametrize("loss", [LOSS, ROW0_BEST], ids=["loss", "row0_best"])
def test_accuracy_orientation_mirrors_loss(loss):
    # Same matrix with the sign flipped and higher-is-better: every transfer metric is unchanged;
    # only the average score flips.
    acc = ResultsMatrix(loss.domains, loss.experiences, -loss.values, "accuracy", False)
    for fn in (
        metrics.forgetting_per_domain,
        metrics.forgetting_from_best_including_row0_per_domain,
        metrics.backward_transfer_per_domain,
        metrics.forward_transfer_per_domain,
        metrics.plasticity_per_experience,
        metrics.adaptation_gain_per_experience,
    ):
        assert fn(acc) == pytest.approx(fn(loss))
    assert metrics.retention(acc).keys() == metrics.retention(loss).keys()
    for t, later in metrics.retention(loss).items():
        assert metrics.retention(acc)[t] == pytest.approx(later)
    assert metrics.average_score(acc) == pytest.approx(-metrics.average_score(loss))


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
    assert metrics.adaptation_gain_per_experience(acc) == pytest.approx([0.9 - 0.1, 0.8 - 0.2])
    assert metrics.retention(acc) == {1: [pytest.approx((0.6 - 0.1) / 0.8)], 2: []}
    assert metrics.forgetting_from_best_including_row0_per_domain(acc) == pytest.approx({"a": 0.3})


def test_hand_computed_accuracy_matrix_row0_best():
    # a: accuracy 0.5 before any experience, training a reaches only 0.4, then 0.2 at the end;
    # b is learned (0.25 → 0.75), then partly forgotten (0.5) while c trains.
    acc = ResultsMatrix(
        ["a", "b", "c"],
        ["a", "b", "c"],
        np.array([[0.5, 0.25, 0.0], [0.4, 0.25, 0.0], [0.3, 0.75, 0.0], [0.2, 0.5, 0.5]]),
        metric="accuracy",
        lower_is_better=False,
    )
    assert metrics.forgetting_per_domain(acc) == pytest.approx({"a": 0.2, "b": 0.25})
    f0 = metrics.forgetting_from_best_including_row0_per_domain(acc)
    assert f0 == pytest.approx({"a": 0.5 - 0.2, "b": 0.25})
    assert metrics.average_forgetting_including_row0(acc) == pytest.approx(0.275)
    assert metrics.adaptation_gain_per_experience(acc) == pytest.approx([-0.1, 0.5, 0.5])
    assert metrics.retention(acc) == {2: [pytest.approx(0.5)], 3: []}
    assert metrics.retention_after(acc, 1) == pytest.approx(0.5)


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
            "adaptation_gain": 8.5 / 3,
            "retention_after_2": 0.25,
            "average_forgetting_including_row0": 1.25,
            "held_out_change": math.nan,  # every domain is trained
            "consolidated_fraction": math.nan,  # no reset rows
            "consolidated_at_end": math.nan,
            "area_under_curve": (3.0 + 5.0) / 2,
        },
        nan_ok=True,
    )
    assert "area_under_curve" not in metrics.summary(LOSS)


def test_held_out_change_is_the_change_since_row_0_on_the_domains_no_experience_trains():
    # books and wiki are never trained (the base's pretraining text); c is trained, but only by
    # experience 3, which has not run at row 2: it is not held out.
    m = ResultsMatrix(
        ["a", "books", "c", "wiki"], ["a", "a", "c"],
        np.array([[4.0, 3.0, 6.0, 2.0],
                  [2.0, 3.5, 6.5, 2.25],
                  [1.5, 3.25, 5.5, 1.5],
                  [np.nan] * 4]),
    )
    assert metrics.held_out_change_per_domain(m) == pytest.approx({"books": 3.0 - 3.25, "wiki": 2.0 - 1.5})
    assert metrics.held_out_change(m) == pytest.approx((-0.25 + 0.5) / 2)
    # On an accuracy matrix higher is better: the sign is the same "positive = better".
    acc = ResultsMatrix(["a", "held"], ["a"], np.array([[0.5, 0.8], [0.9, 0.6]]), metric="accuracy",
                        lower_is_better=False)
    assert metrics.held_out_change(acc) == pytest.approx(0.6 - 0.8)


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


# --- the registry (analysis.metrics.METRICS) ---------------------------------------------------------
def test_every_registry_entry_is_in_summary_with_its_functions_value():
    run = _run()
    s = metrics.summary(run)
    # The order every output keeps (comparison.json, trials.csv, the report's summary table).
    assert list(metrics.METRICS) == [
        "average_final", "average_forgetting", "backward_transfer", "forward_transfer", "plasticity",
        "adaptation_gain", "retention_after_2", "average_forgetting_including_row0", "held_out_change",
        "consolidated_fraction", "consolidated_at_end", "area_under_curve",
    ]
    assert list(s) == [*metrics.SUMMARY_FIELDS, *metrics.METRICS]
    by_hand = {"average_final": 8.5 / 3, "average_forgetting": 1.25, "backward_transfer": -1.0,
               "forward_transfer": 0.5, "plasticity": 2.5, "adaptation_gain": 8.5 / 3, "retention_after_2": 0.25,
               "average_forgetting_including_row0": 1.25, "held_out_change": math.nan,
               "consolidated_fraction": math.nan, "consolidated_at_end": math.nan,  # no reset rows
               "area_under_curve": (3.0 + 5.0) / 2}
    for name, m in metrics.METRICS.items():
        assert m.name == name
        assert s[name] == pytest.approx(m.fn(run if m.needs_run else LOSS), nan_ok=True)
        assert s[name] == pytest.approx(by_hand[name], nan_ok=True)
    # The metrics of the reset rows and of the curves need the run; a bare matrix's summary leaves
    # them out, the rest unchanged.
    needs_run = ["consolidated_fraction", "consolidated_at_end", "area_under_curve"]
    assert [n for n, m in metrics.METRICS.items() if m.needs_run] == needs_run
    s_matrix = metrics.summary(LOSS)
    assert list(s_matrix) == [*metrics.SUMMARY_FIELDS, *[n for n in metrics.METRICS if n not in needs_run]]
    assert s_matrix == pytest.approx({k: v for k, v in s.items() if k not in needs_run}, nan_ok=True)
    with pytest.raises(TypeError, match="RunResults"):
        metrics.METRICS["area_under_curve"].value(LOSS)


def test_registry_labels_and_orders_of_the_printed_and_comparison_tables():
    # `clp run`'s printed lines (experiments/run.py:report), in their order.
    assert [(m.name, m.label) for m in metrics.report_order()] == [
        ("average_final", "average final loss"),
        ("adaptation_gain", "adaptation gain (vs row 0)"),
        ("retention_after_2", "gain left 2 experiences later"),
        ("average_forgetting", "average forgetting"),
        ("average_forgetting_including_row0", "forgetting from best incl. row 0"),
        ("backward_transfer", "backward transfer"),
        ("forward_transfer", "forward transfer"),
        ("plasticity", "plasticity"),
        ("held_out_change", "held-out domains' change (vs row 0)"),
        ("consolidated_fraction", "gain left without the fast memory"),
        ("consolidated_at_end", "gain held without the memory at the end"),
        ("area_under_curve", "area under forgetting curves"),
    ]
    # The comparison report's columns: head and whether the cell is signed (changes are, a level and a
    # fraction are not).
    assert comparison_report_columns() == {
        "adaptation_gain": ("adaptation gain", True), "retention_after_2": ("retention after 2", False),
        "average_forgetting": ("average forgetting", True), "held_out_change": ("held-out change", True),
        "consolidated_fraction": ("consolidated", False), "average_final": ("final average loss", False),
    }
    assert [m.name for m in metrics.comparison_columns()] == list(metrics.COMPARISON_TABLE)


def _run_with_docs(values: np.ndarray, docs: int = 20, seed: int = 0) -> RunResults:
    """A run whose matrix is exactly `values` (loss, order a → b → c), from `docs` documents of 100
    tokens per domain: each document is the cell plus a per-document offset (mean 0, the same in
    every row)."""
    rng = np.random.default_rng(seed)
    domains = ["a", "b", "c"][: values.shape[1]]
    offset = rng.normal(0, 0.5, size=(len(domains), docs))
    offset -= offset.mean(axis=1, keepdims=True)
    doc_losses = {str(t): {d: [[float((values[t, j] + offset[j, k]) * 100), 100] for k in range(docs)]
                           for j, d in enumerate(domains)} for t in range(values.shape[0])}
    matrix = ResultsMatrix(domains, domains[: values.shape[0] - 1], values)
    return RunResults(matrix=matrix, config_hash="h", seed=0, mode="fast", memory_policy="frozen", strategy="naive",
                      doc_losses=doc_losses, curves={"a": [(0, 4.0), (10, 2.0)]})


def test_bootstrap_intervals_exactly_for_interval_entries():
    run = _run_with_docs(LOSS.values)
    ci = bootstrap(run, samples=200, seed=0)
    with_interval = [n for n, m in metrics.METRICS.items() if m.interval]
    assert set(with_interval) == {"average_final", "adaptation_gain", "average_forgetting",
                                  "average_forgetting_including_row0", "retention_after_2", "held_out_change"}
    assert list(ci["metrics"]) == with_interval
    s = metrics.summary(run)
    for name in with_interval:
        point = ci["metrics"][name]
        assert point["value"] == pytest.approx(s[name], nan_ok=True)
        assert not point["low"] > point["high"]  # NaN for held_out_change: every domain is trained
    assert ci["metrics"]["average_forgetting"]["value"] == pytest.approx(1.25)
    assert ci["metrics"]["retention_after_2"]["value"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="cannot have an interval"):
        metrics.Metric("curvy", metrics.mean_area_under_learning_curves, "curvy", False, interval=True, kind="level",
                       needs_run=True)
    with pytest.raises(ValueError, match="kind"):
        metrics.Metric("odd", metrics.average_score, "odd", False, interval=False, kind="ratio")


# Order a → b → c, and a domain "held" that no experience trains. GOOD learns every domain and keeps
# it, and leaves "held" as it was; BAD learns less, hurts the domains it does not train (negative
# forward transfer), forgets what it learned (a's final 5.0 against its best 4.0) and makes "held" worse.
GOOD = np.array([[5.0, 5.0, 5.0, 5.0], [3.0, 4.0, 5.0, 5.0], [3.0, 2.0, 4.5, 5.0], [3.0, 2.0, 2.0, 5.0]])
BAD = np.array([[5.0, 5.0, 5.0, 5.0], [4.0, 5.5, 5.0, 5.5], [4.5, 3.0, 5.5, 6.0], [5.0, 4.0, 3.5, 6.0]])
# The same rows read with the fast memory put back to the base's: GOOD's slow weights hold half of
# each gain right after its experience (a: 1 of 2, b: 1.5 of 3, c: 1.5 of 3) and most of it at the
# end (a: 0.5); BAD's hold less (a: 0 of 1, b: 0.5 of 2, c: 0.5 of 1.5), and of a and b nothing at the end.
GOOD_RESET = np.array([[5.0, 5.0, 5.0, 5.0], [4.0, 5.0, 5.0, 5.0], [4.0, 3.5, 5.0, 5.0], [4.5, 3.5, 3.5, 5.0]])
BAD_RESET = np.array([[5.0, 5.0, 5.0, 5.0], [5.0, 5.5, 5.0, 5.5], [5.0, 4.5, 5.5, 6.0], [5.0, 5.0, 4.5, 6.0]])
GOOD_CURVE, BAD_CURVE = [(0, 5.0), (10, 3.0)], [(0, 5.0), (10, 4.0)]


def _oriented_run(values: np.ndarray, curve: list, lower_is_better: bool, reset: np.ndarray | None = None) -> RunResults:
    sign = 1.0 if lower_is_better else -1.0

    def matrix(v: np.ndarray) -> ResultsMatrix:
        return ResultsMatrix(["a", "b", "c", "held"], ["a", "b", "c"], sign * v,
                             "loss" if lower_is_better else "accuracy", lower_is_better)

    return RunResults(matrix=matrix(values), config_hash="h", seed=0, mode="fast", memory_policy="frozen",
                      strategy="naive", curves={"a": [(step, sign * v) for step, v in curve]},
                      memory_reset=None if reset is None else matrix(reset))


@pytest.mark.parametrize("lower_is_better", [True, False], ids=["loss", "accuracy"])
def test_registry_directions_agree_with_a_run_known_to_be_worse(lower_is_better):
    good = metrics.summary(_oriented_run(GOOD, GOOD_CURVE, lower_is_better, GOOD_RESET))
    bad = metrics.summary(_oriented_run(BAD, BAD_CURVE, lower_is_better, BAD_RESET))
    # BAD's later rows are worse: it forgets (F > 0, and lower forgetting is better) and its BWT is negative.
    assert bad["average_forgetting"] == pytest.approx(1.0)
    assert bad["average_forgetting_including_row0"] == pytest.approx(1.0)
    assert good["average_forgetting"] == pytest.approx(0.0)
    assert metrics.METRICS["average_forgetting"].higher_is_better is False
    assert bad["backward_transfer"] == pytest.approx(-1.0)
    assert metrics.METRICS["backward_transfer"].higher_is_better is True
    assert (good["forward_transfer"], bad["forward_transfer"]) == pytest.approx((0.75, -0.5))
    assert (good["plasticity"], bad["plasticity"]) == pytest.approx((6.5 / 3, 5.5 / 3))
    assert (good["adaptation_gain"], bad["adaptation_gain"]) == pytest.approx((8.0 / 3, 1.5))
    assert (good["retention_after_2"], bad["retention_after_2"]) == pytest.approx((1.0, 0.0))
    assert (good["held_out_change"], bad["held_out_change"]) == pytest.approx((0.0, -1.0))
    assert (good["consolidated_fraction"], bad["consolidated_fraction"]) == pytest.approx((4.0 / 8.0, 1.0 / 4.5))
    assert (good["consolidated_at_end"], bad["consolidated_at_end"]) == pytest.approx((3.5 / 8.0, 0.5 / 4.5))
    # Levels are in metric units: a loss (lower is better), or an accuracy (higher is better).
    sign = 1.0 if lower_is_better else -1.0
    assert (good["average_final"], bad["average_final"]) == pytest.approx((sign * 12.0 / 4, sign * 18.5 / 4))
    assert (good["area_under_curve"], bad["area_under_curve"]) == pytest.approx((sign * 4.0, sign * 4.5))
    matrix = _oriented_run(GOOD, GOOD_CURVE, lower_is_better).matrix
    for name, m in metrics.METRICS.items():
        assert good[name] != pytest.approx(bad[name]), name
        assert (good[name] > bad[name]) == m.better_if_higher(matrix), name
    assert metrics.METRICS["average_final"].better_if_higher(matrix) is (not lower_is_better)


def test_a_new_registry_row_reaches_summary_report_order_and_bootstrap(monkeypatch):
    spread = metrics.Metric("final_spread", lambda m: float(np.ptp(m.values[metrics.last_row(m)])),
                            "spread of final losses", higher_is_better=False, interval=True, kind="level")
    monkeypatch.setitem(metrics.METRICS, "final_spread", spread)
    s = metrics.summary(_run())
    assert list(s)[-2:] == ["area_under_curve", "final_spread"]
    assert s["final_spread"] == pytest.approx(3.5 - 2.0)
    assert metrics.summary(LOSS)["final_spread"] == pytest.approx(1.5)
    assert metrics.report_order()[-1] is spread
    ci = bootstrap(_run_with_docs(LOSS.values), samples=100, seed=0)
    assert list(ci["metrics"])[-1] == "final_spread"
    assert ci["metrics"]["final_spread"]["value"] == pytest.approx(1.5)
    assert ci["metrics"]["final_spread"]["low"] < ci["metrics"]["final_spread"]["high"]
    # Without an interval it is still summarised, but not bootstrapped.
    monkeypatch.setitem(metrics.METRICS, "final_spread", metrics.Metric(
        "final_spread", spread.fn, spread.label, higher_is_better=False, interval=False, kind="level"))
    assert metrics.summary(LOSS)["final_spread"] == pytest.approx(1.5)
    assert "final_spread" not in bootstrap(_run_with_docs(LOSS.values), samples=20, seed=0)["metrics"]


def test_a_metric_a_short_stream_cannot_define_says_what_it_needs():
    """Printed tables show `n/a (needs ...)` where a metric is NaN: each such NaN on a short stream
    has its own reason, not the generic one."""
    one = ResultsMatrix(["a", "b"], ["a"], np.array([[4.0, 5.0], [3.0, 5.5]]))
    two = ResultsMatrix(["a", "b"], ["a", "b"], np.array([[4.0, 5.0], [3.0, 5.5], [3.5, 4.0]]))
    undefined = {name: m.undefined_text for name, m in metrics.METRICS.items()
                 if not m.needs_run and math.isnan(m.value(one))}
    assert undefined == {
        "average_forgetting": "n/a (needs a domain trained before the last experience)",
        "backward_transfer": "n/a (needs a domain trained before the last experience)",
        "forward_transfer": "n/a (needs a domain first trained after experience 1)",
        "retention_after_2": "n/a (needs ≥ 3 experiences and a gain to retain)",
        "average_forgetting_including_row0": "n/a (needs a domain trained before the last experience)",
    }
    # Two domains, both trained: retention two experiences later is undefined, and no domain is held out.
    assert [n for n, m in metrics.METRICS.items() if not m.needs_run and math.isnan(m.value(two))] == \
        ["retention_after_2", "held_out_change"]
    assert metrics.METRICS["held_out_change"].undefined_text == "n/a (needs a domain no experience trains)"
    assert metrics.METRICS["area_under_curve"].undefined_text == "n/a (needs forgetting curves)"


def test_consolidated_fraction_needs_the_reset_rows_up_to_the_last_row_and_a_gain():
    run = _oriented_run(GOOD, GOOD_CURVE, True, GOOD_RESET)
    assert metrics.consolidated_fraction(run) == pytest.approx(0.5)
    # Fast mode's naive: the reset rows are row 0 again, nothing consolidated.
    assert metrics.consolidated_fraction(_oriented_run(GOOD, GOOD_CURVE, True, np.tile(GOOD[:1], (4, 1)))) == 0.0
    assert math.isnan(metrics.consolidated_fraction(_oriented_run(GOOD, GOOD_CURVE, True)))  # results from before it
    partial = GOOD_RESET.copy()
    partial[3] = np.nan  # the run's rows reach 3, its reset rows only 2
    assert math.isnan(metrics.consolidated_fraction(_oriented_run(GOOD, GOOD_CURVE, True, partial)))
    flat = np.tile(GOOD[:1], (4, 1))  # no gain at all: no fraction of it
    assert math.isnan(metrics.consolidated_fraction(_oriented_run(flat, GOOD_CURVE, True, flat)))
    assert math.isnan(metrics.consolidated_at_end(_oriented_run(flat, GOOD_CURVE, True, flat)))
