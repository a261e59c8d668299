"""Several runs of one configuration that differ only by seed → mean ± std of every matrix entry
and every headline metric (numpy only).

    agg = aggregate([RunResults.from_json(p) for p in paths], labels=["seed 0", "seed 1", "seed 2"])
    print(format_aggregate(agg))
    agg["metrics"]["average_forgetting"]    # {"mean": ..., "std": ..., "values": [...]}

std is the sample standard deviation (ddof = 1), the spread a reader expects beside a mean over
seeds; with one run it is NaN, never 0, so a single run cannot pass for a certain one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.metrics import summary
from cl_platform.results import ResultsMatrix, RunResults


def _mean_std(values: Sequence[float]) -> dict[str, Any]:
    a = np.asarray(values, dtype=np.float64)
    std = float(a.std(ddof=1)) if a.size > 1 else math.nan
    return {"mean": float(a.mean()), "std": std, "values": [float(v) for v in a]}


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
            metrics[key] = _mean_std(values)
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
    }


def mean_matrix(agg: dict[str, Any]) -> ResultsMatrix:
    """The mean matrix as a ResultsMatrix (what metrics and tables take)."""
    return ResultsMatrix(agg["domains"], agg["experiences"], agg["matrix_mean"], agg["metric"], agg["lower_is_better"])


def format_aggregate(agg: dict[str, Any], precision: int = 3) -> str:
    """The matrix as `mean ± std` cells and the metrics as `mean ± std  (per-run values)`."""
    mean, std = np.asarray(agg["matrix_mean"]), np.asarray(agg["matrix_std"])
    labels = ["0 before"] + [f"{t} {d}" for t, d in enumerate(agg["experiences"], start=1)]
    cells = [[f"{m:.{precision}f} ± {s:.{precision}f}" for m, s in zip(mr, sr)] for mr, sr in zip(mean, std)]
    width = max(len(c) for row in cells for c in row)
    head = f"{agg['metric']}, mean ± std over {len(agg['runs'])} runs ({', '.join(agg['runs'])})"
    label_width = max(len(label) for label in labels)
    lines = [head, " " * label_width + "".join(f"  {d:>{width}}" for d in agg["domains"])]
    for label, row in zip(labels, cells):
        lines.append(label.ljust(label_width) + "".join(f"  {c:>{width}}" for c in row))
    lines.append("")
    for key, stat in agg["metrics"].items():
        runs = ", ".join(f"{v:+.4f}" for v in stat["values"])
        lines.append(f"  {key:<34} {stat['mean']:+.4f} ± {stat['std']:.4f}   ({runs})")
    return "\n".join(lines)
