"""Several runs of one configuration that differ only by seed → mean ± std of every matrix entry
and every headline metric, a t-interval over the runs, and each experience's adaptation gain.

    agg = aggregate([RunResults.from_json(p) for p in paths], labels=["base 0", "base 1", "base 2"])
    print(format_aggregate(agg))
    agg["metrics"]["average_forgetting"]    # {"mean", "std", "t95": [lo, hi], "cv", "values"}
    agg["experience_gains"][0]              # experience 1's gain G_1 over the runs, same statistics

std is the sample standard deviation (ddof = 1), the spread a reader expects beside a mean over
seeds; with one run it is NaN, never 0, so a single run cannot pass for a certain one. `t95` is the
95 % Student-t interval of the mean over the runs (n − 1 degrees of freedom): over pretraining
seeds (`clp run --base-seeds`) it is the between-base interval that issue 22 asks base-dependent
numbers to quote, unlike the document bootstrap of one run, which is within one base. `cv` is
std / |mean| (the spread of a gain relative to its size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from analysis.metrics import METRICS, adaptation_gain_per_experience, summary
from analysis.table import ONE_SEED, interval, number
from cl_platform.results import ResultsMatrix, RunResults


def mean_std(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean, sample std, the Student-t interval of the mean at `level`, std/|mean| and the values;
    with one value std, interval and cv are NaN."""
    a = np.asarray(values, dtype=np.float64)
    n, mean = a.size, float(a.mean())
    std = float(a.std(ddof=1)) if n > 1 else math.nan
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n) if n > 1 else math.nan
    cv = std / abs(mean) if mean != 0 else math.nan
    return {"mean": mean, "std": std, "t95": [mean - half, mean + half], "cv": cv, "values": [float(v) for v in a]}


def aggregate(runs: Sequence[RunResults], labels: Sequence[str] | None = None) -> dict[str, Any]:
    """Mean and sample std over `runs` of R[t, j] and of `analysis.metrics.summary`'s numbers.

    Every run must be complete and have the same domains, experiences and metric; `labels` name
    the runs (e.g. their seeds) in the output.
    """
    if not runs:
        raise ValueError("aggregate: no runs")
    labels = list(labels) if labels is not None else [str(i) for i in range(len(runs))]
    if len(labels) != len(runs):
        raise ValueError(f"aggregate: {len(labels)} labels for {len(runs)} runs")
    first = runs[0].matrix
    for label, run in zip(labels, runs):
        m = run.matrix
        if (m.domains, m.experiences, m.metric, m.lower_is_better) != (
                first.domains, first.experiences, first.metric, first.lower_is_better):
            raise ValueError(f"aggregate: run {label} has another matrix layout ({m.domains}, {m.experiences}, "
                             f"{m.metric}) than run {labels[0]} ({first.domains}, {first.experiences}, {first.metric})")
        if not m.is_complete:
            raise ValueError(f"aggregate: run {label} is not complete (last row {m.last_complete_row})")
    stack = np.stack([run.matrix.values for run in runs])  # (S, T+1, D)
    metrics: dict[str, dict[str, Any]] = {}
    summaries = [summary(run) for run in runs]
    for key, value in summaries[0].items():
        values = [s[key] for s in summaries]
        if isinstance(value, float) and not all(math.isnan(v) for v in values):  # e.g. no curves: no AUC
            metrics[key] = mean_std(values)
    # G_t of every experience (the per-domain gain targets are on these, over bases).
    gains = np.array([adaptation_gain_per_experience(run.matrix) for run in runs])  # (S, T)
    experience_gains = [{"experience": name, **mean_std(gains[:, t])} for t, name in enumerate(first.experiences)]
    return {
        "runs": labels,
        "config_hashes": [run.config_hash for run in runs],
        "domains": list(first.domains),
        "experiences": list(first.experiences),
        "metric": first.metric,
        "lower_is_better": first.lower_is_better,
        "matrix_mean": stack.mean(axis=0).tolist(),
        "matrix_std": (stack.std(axis=0, ddof=1) if len(runs) > 1 else np.full(stack.shape[1:], np.nan)).tolist(),
        "metrics": metrics,
        "experience_gains": experience_gains,
    }


def mean_matrix(agg: dict[str, Any]) -> ResultsMatrix:
    """The mean matrix as a ResultsMatrix (what metrics and tables take)."""
    return ResultsMatrix(agg["domains"], agg["experiences"], agg["matrix_mean"], agg["metric"], agg["lower_is_better"])


def format_aggregate(agg: dict[str, Any], precision: int = 3) -> str:
    """The matrix as `mean ± std` cells, the metrics as `mean ± std  [t-interval]  (per-run values)`,
    then each experience's adaptation gain with its coefficient of variation."""
    mean, std = np.asarray(agg["matrix_mean"]), np.asarray(agg["matrix_std"])
    labels = ["0 before"] + [f"{t} {d}" for t, d in enumerate(agg["experiences"], start=1)]
    cells = [[f"{m:.{precision}f} ± {number(s, f'.{precision}f', ONE_SEED)}" for m, s in zip(mr, sr)]
             for mr, sr in zip(mean, std)]
    width = max(len(c) for row in cells for c in row)
    n = len(agg["runs"])
    head = f"{agg['metric']}, mean ± std over {n} run{'' if n == 1 else 's'} ({', '.join(agg['runs'])})"
    label_width = max(len(label) for label in labels)
    lines = [head, " " * label_width + "".join(f"  {d:>{width}}" for d in agg["domains"])]
    for label, row in zip(labels, cells):
        lines.append(label.ljust(label_width) + "".join(f"  {c:>{width}}" for c in row))
    lines.append("")
    lines.append(f"  {'metric':<34} mean ± std        95 % t-interval over the {n} runs   (per run)")
    for key, metric in METRICS.items():
        # `aggregate` leaves out a metric no run has (e.g. retention 2 experiences later on a
        # 2-domain stream): printed as what it needs, not dropped in silence.
        stat = agg["metrics"].get(key)
        text = metric.undefined_text if stat is None else _stat_text(stat, undefined=metric.undefined_text)
        lines.append(f"  {key:<34} {text}")
    lines.append("")
    lines.append(f"  {'adaptation gain of experience':<34} mean ± std        95 % t-interval   cv   (per run)")
    for t, stat in enumerate(agg.get("experience_gains", []), start=1):
        cv = f"{100 * stat['cv']:.0f} %" if math.isfinite(stat["cv"]) else "n/a"
        label = f"{t} {stat['experience']}"
        lines.append(f"  {label:<34} {_stat_text(stat, cv)}")
    return "\n".join(lines)


def _stat_text(stat: dict[str, Any], extra: str = "", undefined: str = "n/a") -> str:
    """`mean ± std   [t-interval]   extra   (per run)`; `undefined` where a run has no value (the
    mean is NaN), `n/a (1 seed)` for the spread of one run."""
    runs = ", ".join(number(v, "+.4f") for v in stat["values"])
    if math.isnan(stat["mean"]):
        return f"{undefined}   ({runs})"
    if len(stat["values"]) == 1:  # no spread, interval or cv: the one value
        return f"{stat['mean']:+.4f} ± {ONE_SEED}"
    spread, ci = number(stat["std"], ".4f"), interval(*stat["t95"])
    return f"{stat['mean']:+.4f} ± {spread}   {ci}{'   ' + extra if extra else ''}   ({runs})"
