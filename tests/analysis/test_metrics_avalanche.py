"""`analysis.metrics` against avalanche-lib's own definitions (checked with avalanche-lib 0.6.0).

What Avalanche provides and what each is compared with:

- `avalanche.evaluation.functional.forgetting(acc, boundary_indices)`, its only functional metric:
  F[t, k] = acc[b_k, k] - acc[t, k] for t > b_k, 0 for t <= b_k (b_k = row where k was learned).
- Plugin metrics `ExperienceForgetting` / `StreamForgetting`, `ExperienceBWT` / `StreamBWT`
  (metrics/forgetting_bwt.py) and `ExperienceForwardTransfer` / `StreamForwardTransfer`
  (metrics/forward_transfer.py), on top of the standalone key-value `Forgetting`, `BWT` and
  `ForwardTransfer`. They read accuracies from a strategy's evaluation loop. `_replay` drives the
  real plugin classes through their callbacks with a stand-in strategy whose "accuracy" of eval
  experience j after experience t is g[t, j], so what is compared includes Avalanche's rules for
  the reference value (refreshed whenever an experience is trained on; FWT: the evaluation after
  the experience with the preceding id) and for which experiences are averaged.

Conventions and conversions:

- Avalanche assumes higher is better: it is given g (= R for accuracy, -R for a loss), and our
  metrics are computed on R itself with `lower_is_better` set, so the test also covers the
  orientation.
- Avalanche's forgetting is initial - last, our BWT is last - initial: BWT_j = -forgetting
  (`forgetting_to_bwt`); StreamForgetting = -backward_transfer.
- The functional matrix has no before-training row: with `boundary_indices` omitted, its row k is
  our row k + 1 and experience k trains domain k. Given our whole matrix, `boundary_indices`
  chooses the reference row instead: b_k = 0 gives the row-0 reference of adaptation gain and
  retention, b_k = t - 1 that of plasticity, b_k = l the candidate best row l of forgetting.
- Avalanche's experience id of a domain is its column index here (`_replay`), so a recurring
  domain is the same experience trained again. For forward transfer the id is the position of the
  domain in the stream, since Avalanche takes "the previous experience" to be id - 1.
- Avalanche's stream means are 0 when nothing is averaged; ours are NaN.

Not in Avalanche (so compared only through `functional.forgetting` with a chosen reference row,
which checks our rows, signs and orientation, not an independent definition):

- forgetting from the best row (ours, with or without row 0): Avalanche measures from the value
  right after training. F_j = max over candidate rows l of functional.forgetting(g, [l] * D)[T, j];
  they agree with Avalanche's own forgetting only when a domain peaks right after its training;
- adaptation gain and retention (reference row 0), plasticity (reference row t - 1);
- forward transfer under recurrence: Avalanche's reference is the latest evaluation after the
  experience with the preceding id, ours the row before first(j); compared without recurrence only.
  In a part-finished run Avalanche also reports FWT for the domain of experience T + 1, whose
  reference row T is measured; ours leaves it out until that experience has finished;
- average score and area under the learning curves.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from analysis import metrics
from cl_platform.results import ResultsMatrix

functional = pytest.importorskip("avalanche.evaluation.functional")
forgetting_bwt = pytest.importorskip("avalanche.evaluation.metrics.forgetting_bwt")
forward_transfer = pytest.importorskip("avalanche.evaluation.metrics.forward_transfer")

NAN = math.nan


def _oriented(matrix: ResultsMatrix) -> np.ndarray:
    """g up to the last complete row: what Avalanche is given."""
    g = -matrix.values if matrix.lower_is_better else matrix.values
    return g[: metrics.last_row(matrix) + 1]


def _replay(plugin_cls: type, matrix: ResultsMatrix, ids: list[int] | None = None):
    """An Avalanche plugin metric after the evaluations of rows 0..T (row 0 before any training).

    ids[j] is the Avalanche experience id of column j (default: j). Before row t >= 1 the
    strategy trains experience ids[d_t]; each row evaluates every column in id order.
    """
    g = _oriented(matrix)
    ids = list(range(len(matrix.domains))) if ids is None else ids
    column = {k: j for j, k in enumerate(ids)}

    class FromMatrix(plugin_cls):
        row = 0

        def metric_update(self, strategy):
            pass

        def metric_result(self, strategy):
            return float(g[self.row, column[strategy.experience.current_experience]])

    def experience(k: int) -> SimpleNamespace:
        return SimpleNamespace(
            current_experience=k, origin_stream=SimpleNamespace(name="test"), task_labels=[0]
        )

    plugin = FromMatrix()
    clock = SimpleNamespace(train_iterations=0)
    strategy = SimpleNamespace(is_eval=True, eval_every=0, clock=clock)
    for t in range(len(g)):
        if t:
            strategy.experience = experience(ids[matrix.domains.index(matrix.trained_domain(t))])
            plugin.before_training_exp(strategy)
        plugin.row = t
        plugin.before_eval(strategy)
        for k in sorted(column):
            strategy.experience = experience(k)
            plugin.before_eval_exp(strategy)
            plugin.after_eval_iteration(strategy)
            plugin.after_eval_exp(strategy)
        plugin.after_eval(strategy)
    return plugin


def _by_column(matrix: ResultsMatrix, per_domain: dict[str, float], ids=None) -> dict[int, float]:
    ids = list(range(len(matrix.domains))) if ids is None else ids
    return {ids[matrix.domains.index(d)]: v for d, v in per_domain.items()}


def _stream_mean(ours: float) -> float:
    return 0.0 if math.isnan(ours) else ours


def _random_run(seed: int, recurring: bool, lower_is_better: bool) -> ResultsMatrix:
    """4 domains; 6 experiences drawn with repeats, or the domains once in a shuffled order;
    a loss in (1, 6) or an accuracy in (0, 1); every third seed stops part-way."""
    rng = np.random.default_rng(seed)
    domains = [f"d{k}" for k in range(4)]
    if recurring:
        experiences = [str(d) for d in rng.choice(domains, size=6)]
    else:
        experiences = [str(d) for d in rng.permutation(domains)]
    values = rng.uniform(1.0, 6.0, size=(len(experiences) + 1, 4))
    if not lower_is_better:
        values = (values - 1.0) / 5.0
    if seed % 3 == 2:
        values[int(rng.integers(2, len(experiences) + 1)) :] = NAN
    metric = "loss" if lower_is_better else "accuracy"
    return ResultsMatrix(domains, experiences, values, metric, lower_is_better)


RUNS = [
    pytest.param(seed, rec, lower, id=f"{('seq', 'rec')[rec]}-{('acc', 'loss')[lower]}-{seed}")
    for seed in range(6)
    for rec in (True, False)
    for lower in (True, False)
]


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
def test_square_stream_matches_functional_forgetting_and_standalone_bwt(seed):
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
            assert bwt[f"d{k}"] == pytest.approx(forgetting_bwt.forgetting_to_bwt(float(final[k])))

        # Avalanche's standalone BWT: initial = right after training, last = final row.
        standalone = forgetting_bwt.BWT()
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


@pytest.mark.parametrize(("seed", "recurring", "lower"), RUNS)
def test_bwt_matches_avalanche_plugins(seed, recurring, lower):
    m = _random_run(seed, recurring, lower)
    bwt = _by_column(m, metrics.backward_transfer_per_domain(m))
    assert _replay(forgetting_bwt.ExperienceBWT, m).result() == pytest.approx(bwt)
    forgotten = _replay(forgetting_bwt.ExperienceForgetting, m).result()
    assert forgotten == pytest.approx({k: -v for k, v in bwt.items()})
    mean = _stream_mean(metrics.backward_transfer(m))
    assert _replay(forgetting_bwt.StreamBWT, m).result() == pytest.approx(mean)
    assert _replay(forgetting_bwt.StreamForgetting, m).result() == pytest.approx(-mean)


@pytest.mark.parametrize(("seed", "lower"), [(s, low) for s in range(6) for low in (True, False)])
def test_forward_transfer_matches_avalanche_plugins_without_recurrence(seed, lower):
    m = _random_run(seed, recurring=False, lower_is_better=lower)
    ids = [m.training_experiences(d)[0] - 1 for d in m.domains]  # position in the stream
    fwt = _by_column(m, metrics.forward_transfer_per_domain(m), ids)
    # A run stopped after experience T < len(stream): Avalanche also reports the domain of
    # experience T + 1 (its reference, row T, is measured); ours waits for that experience.
    t_final = metrics.last_row(m)
    if t_final < m.num_experiences:
        j = m.domains.index(m.trained_domain(t_final + 1))
        g = _oriented(m)
        fwt[ids[j]] = float(g[t_final, j] - g[0, j])
    theirs = _replay(forward_transfer.ExperienceForwardTransfer, m, ids).result()
    assert theirs == pytest.approx(fwt)
    mean = float(np.mean(list(fwt.values()))) if fwt else 0.0
    assert _replay(forward_transfer.StreamForwardTransfer, m, ids).result() == pytest.approx(mean)


def _reference_row_forgetting(matrix: ResultsMatrix, row: int) -> np.ndarray:
    """functional.forgetting of g with every domain's reference at `row`: F[t, j] = g[row, j] -
    g[t, j] for t > row."""
    g = _oriented(matrix)
    return functional.forgetting(g, boundary_indices=[row] * g.shape[1])


@pytest.mark.parametrize(("seed", "recurring", "lower"), RUNS)
def test_gain_retention_plasticity_match_functional_forgetting(seed, recurring, lower):
    m = _random_run(seed, recurring, lower)
    t_final = metrics.last_row(m)
    cols = [m.domains.index(m.trained_domain(t)) for t in range(1, t_final + 1)]
    # Against row 0, Avalanche's "forgetting" is minus the gain.
    from_row0 = _reference_row_forgetting(m, 0)
    gains = [-from_row0[t, j] for t, j in enumerate(cols, start=1)]
    assert metrics.adaptation_gain_per_experience(m) == pytest.approx(gains)
    assert metrics.adaptation_gain(m) == pytest.approx(float(np.mean(gains)))
    # ρ_{t,u} = F[u, d_t] / F[t, d_t] with the same row-0 reference.
    expected = {
        t: [from_row0[u, j] / from_row0[t, j] for u in range(t + 1, t_final + 1)]
        for t, j in enumerate(cols, start=1)
        if from_row0[t, j] < 0
    }
    kept = metrics.retention(m)
    assert list(kept) == list(expected)
    for t, later in expected.items():
        assert kept[t] == pytest.approx(later)
    for k in (1, 2, 3):
        fractions = [later[k - 1] for later in expected.values() if len(later) >= k]
        if fractions:
            assert metrics.retention_after(m, k) == pytest.approx(float(np.mean(fractions)))
        else:
            assert math.isnan(metrics.retention_after(m, k))
    # Plasticity: reference row t - 1.
    plastic = [-_reference_row_forgetting(m, t - 1)[t, j] for t, j in enumerate(cols, start=1)]
    assert metrics.plasticity_per_experience(m) == pytest.approx(plastic)


@pytest.mark.parametrize(("seed", "recurring", "lower"), RUNS)
def test_forgetting_from_best_matches_functional_forgetting(seed, recurring, lower):
    m = _random_run(seed, recurring, lower)
    t_final = metrics.last_row(m)
    # Avalanche's forgetting at row T against every possible reference row l < T.
    at_final = np.array([_reference_row_forgetting(m, row)[t_final] for row in range(t_final)])
    without_row0, with_row0 = {}, {}
    for j, domain in enumerate(m.domains):
        trained = [t for t in m.training_experiences(domain) if t <= t_final]
        if trained and trained[-1] < t_final:
            candidates = range(trained[0], t_final)
            without_row0[domain] = max(at_final[l, j] for l in candidates)
            with_row0[domain] = max(at_final[l, j] for l in [0, *candidates])
    assert metrics.forgetting_per_domain(m) == pytest.approx(without_row0)
    assert metrics.forgetting_from_best_including_row0_per_domain(m) == pytest.approx(with_row0)
    if with_row0:
        mean = float(np.mean(list(with_row0.values())))
        assert metrics.average_forgetting_including_row0(m) == pytest.approx(mean)
    else:
        assert math.isnan(metrics.average_forgetting_including_row0(m))
