"""Continual-learning metrics as pure functions of a results matrix (numpy only, no torch).

Notation (see `cl_platform.results`):
    R[t, j]   score on domain j after experience t; row 0 = before any experience
    T         last complete row (a run killed part-way is measured up to where it got)
    d_t       domain trained by experience t (1-based): `experiences[t - 1]`
    first(j)  first experience that trains j;  last(j)  last experience <= T that trains j
    g         R oriented so that larger is better: g = R for accuracy, g = -R for loss

Every transfer-type metric is written with g, so its sign means the same for loss and accuracy:
positive forgetting = worse than the best seen; positive BWT / FWT / plasticity / adaptation gain =
better. For a loss these read, e.g., BWT_j = R[last(j), j] - R[T, j].

Two references for "what experience t did to d_t": plasticity compares with row t-1 (the row just
before it), adaptation gain with row 0 (before any experience). Retention follows an adaptation
gain through the later rows.

A domain may recur (math → law → math): "trained" always refers to the experiences up to row T,
and BWT measures from the domain's most recent training, as Avalanche's stream metrics do (their
reference value is refreshed each time an experience is trained on).

The headline numbers of a run are registered once, in `METRICS` (a `Metric` per number: function,
printed label, direction, whether the bootstrap gives it an interval); `summary`, `clp run`'s
printed summary, analysis/bootstrap.py, the comparison tables, the sweep's objective names and
TensorBoard's hparams all read it, so a new headline number is one new row there.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from cl_platform.results import ResultsMatrix, RunResults


def last_row(results: ResultsMatrix) -> int:
    """T: the last row such that rows 0..T are fully measured."""
    t = results.last_complete_row
    if t < 0:
        raise ValueError("no complete row: the before-training evaluation (row 0) did not finish")
    return t


def _oriented(results: ResultsMatrix) -> np.ndarray:
    return -results.values if results.lower_is_better else results.values


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _trained_before_last_row(results: ResultsMatrix) -> dict[int, tuple[int, int]]:
    """Column j -> (first(j), last(j)) for domains trained by an experience < T (not by T itself).

    A domain trained by experience T was just learned: there is nothing to have forgotten yet.
    """
    t_final = last_row(results)
    spans = {}
    for j, domain in enumerate(results.domains):
        trained = [t for t in results.training_experiences(domain) if t <= t_final]
        if trained and trained[-1] < t_final:
            spans[j] = (trained[0], trained[-1])
    return spans


def average_score(results: ResultsMatrix) -> float:
    """A_T = (1/D) Σ_j R[T, j]: the final score averaged over all domains, in metric units."""
    return float(np.mean(results.values[last_row(results)]))


def forgetting_per_domain(results: ResultsMatrix) -> dict[str, float]:
    """F_j = max_{first(j) <= l <= T-1} g[l, j] - g[T, j], for j trained before experience T.

    For a loss: F_j = R[T, j] - min_l R[l, j], the final loss minus the best loss since j was
    first learned (Chaudhry et al. 2018, with rows before j's training excluded). F_j < 0 only
    when the final row is j's best since first(j).
    Avalanche's functional `forgetting` uses the value right after training instead of the best:
    the two agree when a domain is at its best right after being trained. Row 0 is not a candidate
    best: a domain whose training never beat row 0 and which then ends worse than row 0 only counts
    the drop from its best trained row; `forgetting_from_best_including_row0_per_domain` counts the
    drop from row 0.
    """
    g = _oriented(results)
    t_final = last_row(results)
    return {
        results.domains[j]: float(g[first:t_final, j].max() - g[t_final, j])
        for j, (first, _) in _trained_before_last_row(results).items()
    }


def average_forgetting(results: ResultsMatrix) -> float:
    """F = mean_j F_j over the domains of `forgetting_per_domain`; NaN if there are none."""
    return _mean(list(forgetting_per_domain(results).values()))


def forgetting_from_best_including_row0_per_domain(results: ResultsMatrix) -> dict[str, float]:
    """F0_j = max(g[0, j], max_{first(j) <= l <= T-1} g[l, j]) - g[T, j], for j trained before T.

    `forgetting_per_domain` with row 0 (before any experience) added to the candidate bests:
    F0_j = max(F_j, g[0, j] - g[T, j]) >= F_j. The two differ only when row 0 beats every row
    first(j) .. T-1, i.e. j's training never reached the base model's score: F counts the drop
    from j's best trained row, F0 the drop from row 0. Rows 1 .. first(j)-1 (forward transfer
    from other experiences) are still not candidates. Same domains as `forgetting_per_domain`.
    """
    g = _oriented(results)
    t_final = last_row(results)
    return {
        results.domains[j]: float(g[[0, *range(first, t_final)], j].max() - g[t_final, j])
        for j, (first, _) in _trained_before_last_row(results).items()
    }


def average_forgetting_including_row0(results: ResultsMatrix) -> float:
    """F0 = mean_j F0_j over `forgetting_from_best_including_row0_per_domain`; NaN if none."""
    return _mean(list(forgetting_from_best_including_row0_per_domain(results).values()))


def backward_transfer_per_domain(results: ResultsMatrix) -> dict[str, float]:
    """BWT_j = g[T, j] - g[last(j), j], for j trained before experience T (Lopez-Paz 2017).

    For a loss: BWT_j = R[last(j), j] - R[T, j]; negative = forgotten since j was last trained.
    Equals minus Avalanche's functional `forgetting(acc)[-1, j]` on an accuracy matrix.
    """
    g = _oriented(results)
    t_final = last_row(results)
    return {
        results.domains[j]: float(g[t_final, j] - g[last, j])
        for j, (_, last) in _trained_before_last_row(results).items()
    }


def backward_transfer(results: ResultsMatrix) -> float:
    """BWT = mean_j BWT_j over the domains of `backward_transfer_per_domain`; NaN if none."""
    return _mean(list(backward_transfer_per_domain(results).values()))


def forward_transfer_per_domain(results: ResultsMatrix) -> dict[str, float]:
    """FWT_j = g[first(j) - 1, j] - g[0, j], for j first trained by an experience 2..T.

    How much the experiences before j's own changed its score relative to before any training
    (row 0 is the baseline b_j of Lopez-Paz & Ranzato 2017). For a loss:
    FWT_j = R[0, j] - R[first(j) - 1, j]. The first trained domain has no earlier experience
    and is left out.
    """
    g = _oriented(results)
    t_final = last_row(results)
    transfer = {}
    for j, domain in enumerate(results.domains):
        trained = results.training_experiences(domain)
        if trained and 2 <= trained[0] <= t_final:
            transfer[domain] = float(g[trained[0] - 1, j] - g[0, j])
    return transfer


def forward_transfer(results: ResultsMatrix) -> float:
    """FWT = mean_j FWT_j over the domains of `forward_transfer_per_domain`; NaN if none."""
    return _mean(list(forward_transfer_per_domain(results).values()))


def plasticity_per_experience(results: ResultsMatrix) -> list[float]:
    """P_t = g[t, d_t] - g[t-1, d_t] for t = 1..T: what experience t did to its own domain.

    For a loss: P_t = R[t-1, d_t] - R[t, d_t]; positive = the domain improved during experience t.
    Element t-1 of the list is experience t (a recurring domain has one entry per experience).

    The reference is row t-1, after the earlier experiences' interference, so recovering from that
    interference counts as learning: in math → law → math, if law raises math's loss by δ and the
    second math experience only undoes it, P_3 = δ > 0 though math is no better than after
    experience 1. `adaptation_gain_per_experience` measures against row 0 instead.
    """
    g = _oriented(results)
    gains = []
    for t in range(1, last_row(results) + 1):
        j = results.domains.index(results.trained_domain(t))
        gains.append(float(g[t, j] - g[t - 1, j]))
    return gains


def plasticity(results: ResultsMatrix) -> float:
    """P = (1/T) Σ_t P_t; NaN if no experience has finished."""
    return _mean(plasticity_per_experience(results))


def adaptation_gain_per_experience(results: ResultsMatrix) -> list[float]:
    """G_t = g[t, d_t] - g[0, d_t] for t = 1..T: experience t's domain against row 0.

    For a loss: G_t = R[0, d_t] - R[t, d_t]; positive = after experience t the model is better on
    d_t than the base model was. Unlike plasticity (reference row t-1), undoing interference from
    earlier experiences gains nothing. For a recurring domain G_t is the total gain since row 0,
    including what its earlier experiences left. Element t-1 of the list is experience t.
    """
    g = _oriented(results)
    gains = []
    for t in range(1, last_row(results) + 1):
        j = results.domains.index(results.trained_domain(t))
        gains.append(float(g[t, j] - g[0, j]))
    return gains


def adaptation_gain(results: ResultsMatrix) -> float:
    """G = (1/T) Σ_t G_t; NaN if no experience has finished."""
    return _mean(adaptation_gain_per_experience(results))


def retention(results: ResultsMatrix) -> dict[int, list[float]]:
    """Experience t -> [ρ_{t,t+1}, ..., ρ_{t,T}] for every experience t <= T with G_t > 0, where

        ρ_{t,u} = (g[u, d_t] - g[0, d_t]) / G_t        u = t+1 .. T

    is the fraction of experience t's adaptation gain G_t still present after experience u:
    1 = all kept, 0 = back to row 0, negative = worse than before any experience. Keys are
    1-based experience indices in order; element k-1 of a list is the fraction k experiences
    later, and the list of t = T is empty. An experience with G_t <= 0 has no gain to retain and
    has no key. A later experience that trains d_t again is one of the u like any other, so the
    fraction can rise again there (also above 1).
    """
    g = _oriented(results)
    t_final = last_row(results)
    fractions = {}
    for t, gain in enumerate(adaptation_gain_per_experience(results), start=1):
        if gain > 0:
            j = results.domains.index(results.trained_domain(t))
            later = range(t + 1, t_final + 1)
            fractions[t] = [float((g[u, j] - g[0, j]) / gain) for u in later]
    return fractions


def held_out_change_per_domain(results: ResultsMatrix) -> dict[str, float]:
    """H_j = g[T, j] - g[0, j] for every domain j that no experience of the stream trains.

    The held-out capability (Lin et al.'s "held-out" task; the paper's own protocol keeps general
    text beside the streamed domains): on the reference stream the base's pretraining text, books
    and wiki. For a loss: H_j = R[0, j] - R[T, j]; negative = the stream made the model worse on
    text it was never trained on in the stream. A domain the stream trains later than T is not
    held out (its change then is forward transfer): every experience of the stream counts.
    """
    g = _oriented(results)
    t_final = last_row(results)
    return {domain: float(g[t_final, j] - g[0, j]) for j, domain in enumerate(results.domains)
            if not results.training_experiences(domain)}


def held_out_change(results: ResultsMatrix) -> float:
    """H = mean_j H_j over `held_out_change_per_domain`; NaN if every domain is trained."""
    return _mean(list(held_out_change_per_domain(results).values()))


def retention_after(results: ResultsMatrix, k: int) -> float:
    """ρ(k) = mean_t ρ_{t,t+k} over the experiences of `retention` with t + k <= T; NaN if none.

    The fraction of an adaptation gain left k experiences later, e.g. ρ(2) <= 0.5: on average at
    least half of each gain lost after two later experiences.
    """
    if k < 1:
        raise ValueError(f"k = {k}: retention is measured k >= 1 experiences later")
    return _mean([later[k - 1] for later in retention(results).values() if len(later) >= k])


def _reset_rows(run: RunResults) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(g, g with the memory reset, T) where the run has the reset rows up to T; else None."""
    m, reset = run.matrix, run.memory_reset
    t_final = last_row(m)
    if reset is None or reset.last_complete_row < t_final or t_final < 1:
        return None
    return _oriented(m), _oriented(reset), t_final


def consolidated_fraction(run: RunResults) -> float:
    """C = Σ_t (g°[t, d_t] - g[0, d_t]) / Σ_t (g[t, d_t] - g[0, d_t]) over t = 1..T, where g° is
    the matrix read with the fast memory put back to the base's (`RunResults.memory_reset`).

    The share of the experiences' adaptation gains that survives without what the stream wrote
    into the fast memory: the part the slow weights took (0 when only the memory changed, as in
    fast mode's naive; 1 when the memory adds nothing). A ratio of sums, not a mean of ratios, so
    an experience with almost no gain cannot dominate it. NaN without reset rows or without a gain.
    """
    rows = _reset_rows(run)
    if rows is None:
        return math.nan
    g, g_reset, t_final = rows
    cols = [run.matrix.domains.index(run.matrix.trained_domain(t)) for t in range(1, t_final + 1)]
    gain = sum(g[t, j] - g[0, j] for t, j in enumerate(cols, start=1))
    kept = sum(g_reset[t, j] - g[0, j] for t, j in enumerate(cols, start=1))
    return float(kept / gain) if gain > 0 else math.nan


def consolidated_at_end(run: RunResults) -> float:
    """Σ_j (g°[T, j] - g[0, j]) / Σ_j (g[last(j), j] - g[0, j]) over the domains trained up to T:
    how much of what was learned on each domain the slow weights still hold at the end of the
    stream, without the fast memory (g°: `consolidated_fraction`). NaN without reset rows or gain."""
    rows = _reset_rows(run)
    if rows is None:
        return math.nan
    g, g_reset, t_final = rows
    m = run.matrix
    trained = {j: max(t for t in m.training_experiences(d) if t <= t_final)
               for j, d in enumerate(m.domains) if any(t <= t_final for t in m.training_experiences(d))}
    gain = sum(g[last, j] - g[0, j] for j, last in trained.items())
    kept = sum(g_reset[t_final, j] - g[0, j] for j in trained)
    return float(kept / gain) if gain > 0 else math.nan


def area_under_curve(points: Sequence[tuple[int, float]]) -> float:
    """Step-normalised area under one curve: its mean value over the steps it spans.

        AUC = (1 / (s_n - s_1)) Σ_i (s_{i+1} - s_i) (v_i + v_{i+1}) / 2

    in metric units, so lower is better for a loss. One point gives its value; points that all
    share one step give their mean; no points give NaN.
    """
    if not points:
        return math.nan
    steps = np.array([s for s, _ in points], dtype=np.float64)
    values = np.array([v for _, v in points], dtype=np.float64)
    span = steps[-1] - steps[0]
    if span == 0:
        return float(values.mean())
    return float(np.sum(np.diff(steps) * (values[1:] + values[:-1]) / 2) / span)


def area_under_learning_curves(run: RunResults) -> dict[str, float]:
    """AUC of `run.curves[domain]` for every domain that has a curve (see `area_under_curve`)."""
    return {domain: area_under_curve(points) for domain, points in run.curves.items()}


def mean_area_under_learning_curves(run: RunResults) -> float:
    """The mean over domains of `area_under_learning_curves`; NaN if no domain has a curve."""
    return _mean(list(area_under_learning_curves(run).values()))


# --- the registry of headline numbers ---------------------------------------------------------------
KINDS = ("level", "change", "fraction")


@dataclass(frozen=True)
class Metric:
    """One headline number of a run. Every listing of metrics reads `METRICS`: `summary` (and so
    comparison.json, trials.csv, TensorBoard's `final/<name>` hparams, the names a sweep objective
    may use), `clp run`'s printed summary, the bootstrap's intervals and the comparison tables.

    name              its key in `summary`
    fn                ResultsMatrix -> float; RunResults -> float when `needs_run`
    label             its line in `clp run`'s printed forgetting summary (experiments/run.py:report)
    higher_is_better  which way is better on a loss matrix, the platform's metric (see `better_if_higher`)
    interval          the document bootstrap (analysis/bootstrap.py) gives it an interval
    kind              "level": a score in metric units (a mean loss), so its direction follows the
                      matrix's metric; "change": a difference written with g (module docstring), one sign
                      convention for loss and accuracy, shown signed; "fraction": a ratio of changes
    column            its column head in the comparison report (analysis/report_comparison.py; `clp
                      compare`'s text table abbreviates "average" to "avg"); None: `label`
    needs_run         `fn` reads more than the matrix (the curves, the memory-reset rows), so it
                      takes the RunResults: `summary` of a bare
                      ResultsMatrix leaves the entry out, and the bootstrap (which redraws matrices) cannot
                      give it an interval
    needs             what it is undefined (NaN) without, in a few words: printed tables say
                      `n/a (needs <needs>)` instead of `nan` (`undefined_text`)
    """

    name: str
    fn: Callable[[Any], float]
    label: str
    higher_is_better: bool
    interval: bool
    kind: str
    column: str | None = None
    needs_run: bool = False
    needs: str = "a measured row"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r}: kind {self.kind!r} is not one of {list(KINDS)}")
        if self.interval and self.needs_run:
            raise ValueError(f"metric {self.name!r}: the bootstrap redraws matrices only; a metric of the "
                             "curves (needs_run) cannot have an interval")

    @property
    def column_label(self) -> str:
        return self.column if self.column is not None else self.label

    @property
    def undefined_text(self) -> str:
        """What a table prints for this metric where it is NaN, e.g. on a stream too short for it."""
        return f"n/a (needs {self.needs})"

    @property
    def signed(self) -> bool:
        """Shown with its sign (+/-) in tables: a change can go either way."""
        return self.kind == "change"

    def better_if_higher(self, matrix: ResultsMatrix) -> bool:
        """Whether a higher value is better on `matrix`: `higher_is_better`, flipped for a level
        when the matrix's metric is higher-is-better (accuracy)."""
        if self.kind == "level" and not matrix.lower_is_better:
            return not self.higher_is_better
        return self.higher_is_better

    def value(self, results: RunResults | ResultsMatrix) -> float:
        """`fn` on `results` (its matrix, unless `needs_run`)."""
        if self.needs_run:
            if not isinstance(results, RunResults):
                raise TypeError(f"metric {self.name!r} reads the curves: it needs a RunResults, not a ResultsMatrix")
            return self.fn(results)
        return self.fn(results.matrix if isinstance(results, RunResults) else results)


# `summary`'s entries that are not metrics; they come first.
SUMMARY_FIELDS = ("metric", "lower_is_better", "experiences_done", "experiences_total")


def _registry(*entries: Metric) -> dict[str, Metric]:
    names = [m.name for m in entries]
    clash = sorted({n for n in names if names.count(n) > 1 or n in SUMMARY_FIELDS})
    if clash:
        raise ValueError(f"metric registry: names {clash} are repeated or are summary fields")
    return {m.name: m for m in entries}


# Why forgetting and backward transfer can be undefined: a one-experience stream, or a domain
# trained only by the last experience.
TRAINED_BEFORE_LAST = "a domain trained before the last experience"

# In `summary`'s order (comparison.json, trials.csv and the report's summary table keep it); a new
# entry shows up in all of them and in `clp run`'s printed summary (after the HEADLINE numbers).
METRICS: dict[str, Metric] = _registry(
    Metric("average_final", average_score, "average final loss", higher_is_better=False, interval=True,
           kind="level", column="final average loss"),
    Metric("average_forgetting", average_forgetting, "average forgetting", higher_is_better=False, interval=True,
           kind="change", needs=TRAINED_BEFORE_LAST),
    Metric("backward_transfer", backward_transfer, "backward transfer", higher_is_better=True, interval=False,
           kind="change", needs=TRAINED_BEFORE_LAST),
    Metric("forward_transfer", forward_transfer, "forward transfer", higher_is_better=True, interval=False,
           kind="change", needs="a domain first trained after experience 1"),
    Metric("plasticity", plasticity, "plasticity", higher_is_better=True, interval=False, kind="change",
           needs="a finished experience"),
    Metric("adaptation_gain", adaptation_gain, "adaptation gain (vs row 0)", higher_is_better=True, interval=True,
           kind="change", column="adaptation gain", needs="a finished experience"),
    # The mean fraction of an experience's adaptation gain left two experiences later.
    Metric("retention_after_2", partial(retention_after, k=2), "gain left 2 experiences later",
           higher_is_better=True, interval=True, kind="fraction", column="retention after 2",
           needs="≥ 3 experiences and a gain to retain"),
    Metric("average_forgetting_including_row0", average_forgetting_including_row0, "forgetting from best incl. row 0",
           higher_is_better=False, interval=True, kind="change", needs=TRAINED_BEFORE_LAST),
    # The second forgetting axis: what the stream did to text it never trains on (books, wiki).
    Metric("held_out_change", held_out_change, "held-out domains' change (vs row 0)", higher_is_better=True,
           interval=True, kind="change", column="held-out change", needs="a domain no experience trains"),
    # Fast-to-slow consolidation: the gain left when the fast memory is put back to the base's,
    # right after each experience and at the end of the stream (they read the reset rows, so the
    # RunResults).
    Metric("consolidated_fraction", consolidated_fraction, "gain left without the fast memory",
           higher_is_better=True, interval=False, kind="fraction", column="consolidated", needs_run=True,
           needs="reset rows and a gain"),
    Metric("consolidated_at_end", consolidated_at_end, "gain held without the memory at the end",
           higher_is_better=True, interval=False, kind="fraction", column="consolidated at end", needs_run=True,
           needs="reset rows and a gain"),
    # A metric of the curves, not of the matrix: its fn takes the RunResults (needs_run), and
    # `summary` of a bare matrix has no such entry.
    Metric("area_under_curve", mean_area_under_learning_curves, "area under forgetting curves",
           higher_is_better=False, interval=False, kind="level", needs_run=True, needs="forgetting curves"),
)

# `clp run` prints these first, in this order; then every other entry in registry order.
HEADLINE = ("average_final", "adaptation_gain", "retention_after_2", "average_forgetting",
            "average_forgetting_including_row0")
# The comparison tables' metric columns, in order (`clp compare`, analysis/report_comparison.py).
COMPARISON_TABLE = ("adaptation_gain", "retention_after_2", "average_forgetting", "held_out_change",
                    "consolidated_fraction", "average_final")
# (x, y) of the comparison report's scatter, gain against forgetting; both must be in COMPARISON_TABLE
# (the scatter reads comparison.json's statistics).
TRADE_OFF = ("adaptation_gain", "average_forgetting")
# The y of the report's second scatter (against TRADE_OFF's x): the held-out text's change.
HELD_OUT = "held_out_change"
for _subset in (HEADLINE, COMPARISON_TABLE):
    if not set(_subset) <= set(METRICS):
        raise ValueError(f"metric registry: {sorted(set(_subset) - set(METRICS))} are not registered")
del _subset
if not set(TRADE_OFF) | {HELD_OUT} <= set(COMPARISON_TABLE):
    raise ValueError(f"metric registry: the scatters' {[*TRADE_OFF, HELD_OUT]} must be columns of COMPARISON_TABLE")


def report_order() -> list[Metric]:
    """The registry in `clp run`'s printed order: HEADLINE, then the rest in registry order."""
    return [METRICS[n] for n in HEADLINE] + [m for m in METRICS.values() if m.name not in HEADLINE]


def comparison_columns() -> list[Metric]:
    """The comparison tables' metrics (COMPARISON_TABLE), in column order."""
    return [METRICS[n] for n in COMPARISON_TABLE]


def summary(results: RunResults | ResultsMatrix) -> dict[str, float | int | str | bool]:
    """Headline numbers of one run: SUMMARY_FIELDS, then every `METRICS` entry in registry order;
    the curve metrics (`needs_run`, area_under_curve) only when `results` is a RunResults.
    """
    matrix = results.matrix if isinstance(results, RunResults) else results
    out: dict[str, float | int | str | bool] = {
        "metric": matrix.metric,
        "lower_is_better": matrix.lower_is_better,
        "experiences_done": last_row(matrix),
        "experiences_total": matrix.num_experiences,
    }
    for m in METRICS.values():
        if m.needs_run and not isinstance(results, RunResults):
            continue
        out[m.name] = m.value(results)
    return out
