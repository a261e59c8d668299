"""Intervals for one run: a paired bootstrap over evaluation documents (numpy only).

    ci = bootstrap(RunResults.from_json("runs/default-…/results.json"))
    ci["adaptation_gain_per_experience"][0]    # {"value": 0.012, "low": 0.004, "high": 0.021}

Every row of a run reads the same evaluation documents, so one draw of documents (per domain,
with replacement, as many as the split has) is applied to every row: differences between rows,
such as an adaptation gain R[0, d] − R[t, d], keep their pairing, and their interval reflects
which documents happened to be in the split, not the rows' shared difficulty. A cell of a drawn
matrix is the per-token mean over the drawn documents, Σ loss / Σ tokens, as R itself is.

This interval covers the choice of evaluation documents only; the spread between base models or
seeds is another source (`clp run --seeds/--base-seeds`, analysis/aggregate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from analysis import metrics
from cl_platform.results import ResultsMatrix, RunResults

def scalars() -> dict[str, Callable[[ResultsMatrix], float]]:
    """Headline numbers that get an interval, as functions of a matrix: the registry's entries
    with `interval` (analysis.metrics.METRICS), in registry order."""
    return {m.name: m.fn for m in metrics.METRICS.values() if m.interval}


def document_arrays(results: RunResults) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per domain: (loss sums, token counts), each (rows, documents), for rows 0..T."""
    matrix = results.matrix
    rows = range(metrics.last_row(matrix) + 1)
    missing = [t for t in rows if str(t) not in results.doc_losses]
    if missing:
        raise ValueError(f"bootstrap: rows {missing} have no per-document losses (runs before they were recorded)")
    out = {}
    for domain in matrix.domains:
        docs = [np.asarray(results.doc_losses[str(t)][domain], dtype=np.float64).reshape(-1, 2) for t in rows]
        if len({len(d) for d in docs}) != 1 or not len(docs[0]):
            raise ValueError(f"bootstrap: domain {domain!r} has no documents, or a different number per row")
        out[domain] = (np.stack([d[:, 0] for d in docs]), np.stack([d[:, 1] for d in docs]))
    return out


def bootstrap(results: RunResults, samples: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Point value and percentile interval of every matrix cell, each experience's adaptation gain
    and the `scalars()`, over `samples` paired document draws."""
    if samples < 2 or not 0 < level < 1:
        raise ValueError(f"bootstrap: samples must be >= 2 and level in (0, 1), got {samples}, {level}")
    matrix = results.matrix
    arrays = document_arrays(results)
    rng = np.random.default_rng(seed)
    T1 = metrics.last_row(matrix) + 1
    drawn = np.empty((samples, T1, len(matrix.domains)))
    for j, domain in enumerate(matrix.domains):
        sums, counts = arrays[domain]  # (T+1, K)
        k = sums.shape[1]
        weights = rng.multinomial(k, np.full(k, 1.0 / k), size=samples).astype(np.float64)  # (samples, K)
        drawn[:, :, j] = (weights @ sums.T) / (weights @ counts.T)
    full = np.full((samples, matrix.num_experiences + 1, len(matrix.domains)), np.nan)
    full[:, :T1] = drawn
    tail = (1 - level) / 2

    def interval(value: float, values: list[float]) -> dict[str, float]:
        finite = np.asarray([v for v in values if np.isfinite(v)])
        if not finite.size:
            return {"value": value, "low": float("nan"), "high": float("nan")}
        low, high = np.quantile(finite, [tail, 1 - tail])
        return {"value": value, "low": float(low), "high": float(high)}

    def as_matrix(values: np.ndarray) -> ResultsMatrix:
        return ResultsMatrix(matrix.domains, matrix.experiences, values, matrix.metric, matrix.lower_is_better)

    draws = [as_matrix(v) for v in full]
    gains = [metrics.adaptation_gain_per_experience(m) for m in draws]
    point_gains = metrics.adaptation_gain_per_experience(matrix)
    low, high = np.quantile(drawn, [tail, 1 - tail], axis=0)
    return {
        "samples": samples,
        "seed": seed,
        "level": level,
        "documents": {d: int(arrays[d][0].shape[1]) for d in matrix.domains},
        "matrix_low": low.tolist(),
        "matrix_high": high.tolist(),
        "adaptation_gain_per_experience": [
            interval(point_gains[t], [g[t] for g in gains]) for t in range(len(point_gains))
        ],
        "metrics": {name: interval(float(f(matrix)), [float(f(m)) for m in draws]) for name, f in scalars().items()},
    }
