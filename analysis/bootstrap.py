"""Intervals for one run, and for the difference of two runs: a paired bootstrap over evaluation
documents (numpy only).

    ci = bootstrap(RunResults.from_json("runs/default-…/results.json"))
    ci["adaptation_gain_per_experience"][0]    # {"value": 0.012, "low": 0.004, "high": 0.021}
    d = difference_bootstrap(naive, replay)    # replay − naive, the same draws applied to both
    d["metrics"]["average_forgetting"]         # {"value": -0.27, "low": -0.31, "high": -0.23}

Every row of a run reads the same evaluation documents, so one draw of documents (per domain,
with replacement, as many as the split has) is applied to every row: differences between rows,
such as an adaptation gain R[0, d] − R[t, d], keep their pairing, and their interval reflects
which documents happened to be in the split, not the rows' shared difficulty. A cell of a drawn
matrix is the per-token mean over the drawn documents, Σ loss / Σ tokens, as R itself is.

Two runs on the same base and stream (two strategies, `clp compare`) score the same documents
too, so `difference_bootstrap` draws the documents once for both: the interval of B − A is then
that of the strategies' difference on these documents, narrower than the two runs' own intervals
would suggest, since a hard document is hard for both.

This interval covers the choice of evaluation documents only; the spread between base models or
seeds is another source (`clp run --seeds/--base-seeds`, analysis/aggregate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from analysis import metrics
from cl_platform.results import ResultsMatrix, RunResults

# Below this many evaluation documents in a domain a bootstrap says little (over one document every
# draw is the same: a zero-width interval). Printed intervals say so, and `clp run` warns when it
# builds such a stream; the stream YAML's `token_budget.eval_docs` is the remedy.
MIN_DOCUMENTS = 5
EVAL_DOCS_REMEDY = "set token_budget.eval_docs: N in {stream} to cut each domain's eval budget into N documents"


def few_documents(documents: dict[str, int]) -> dict[str, int]:
    """The domains of `documents` (domain → evaluation documents) with fewer than MIN_DOCUMENTS."""
    return {domain: n for domain, n in documents.items() if n < MIN_DOCUMENTS}


def few_documents_note(documents: dict[str, int]) -> str | None:
    """The line a printed table adds under intervals over these documents when a domain has too
    few of them (None when every domain has enough)."""
    few = few_documents(documents)
    if not few:
        return None
    return (f"not meaningful for {', '.join(few)}: fewer than {MIN_DOCUMENTS} evaluation documents to resample "
            f"({EVAL_DOCS_REMEDY.format(stream='the stream YAML')})")


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


def _draw(arrays: dict[str, tuple[np.ndarray, np.ndarray]], domains: list[str], rows: int,
          weights: dict[str, np.ndarray]) -> np.ndarray:
    """(samples, rows, domains): each cell the per-token mean over the drawn documents."""
    samples = next(iter(weights.values())).shape[0]
    drawn = np.empty((samples, rows, len(domains)))
    for j, domain in enumerate(domains):
        sums, counts = arrays[domain]  # (rows, K)
        drawn[:, :, j] = (weights[domain] @ sums.T) / (weights[domain] @ counts.T)
    return drawn


def _weights(arrays: dict[str, tuple[np.ndarray, np.ndarray]], domains: list[str], samples: int,
             rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per domain, `samples` multinomial document draws (how often each document is drawn)."""
    out = {}
    for domain in domains:
        k = arrays[domain][0].shape[1]
        out[domain] = rng.multinomial(k, np.full(k, 1.0 / k), size=samples).astype(np.float64)
    return out


def _interval(value: float, values: np.ndarray | list[float], level: float) -> dict[str, float]:
    finite = np.asarray([v for v in values if np.isfinite(v)])
    if not finite.size:
        return {"value": value, "low": float("nan"), "high": float("nan")}
    tail = (1 - level) / 2
    low, high = np.quantile(finite, [tail, 1 - tail])
    return {"value": value, "low": float(low), "high": float(high)}


def difference_bootstrap(a: RunResults, b: RunResults, samples: int = 1000, seed: int = 0,
                         level: float = 0.95) -> dict[str, Any]:
    """B − A of every `scalars()` metric: the point difference and its percentile interval over
    `samples` document draws, each draw applied to both runs (they must score the same documents:
    the same domains, experiences and token counts per document and row)."""
    if samples < 2 or not 0 < level < 1:
        raise ValueError(f"bootstrap: samples must be >= 2 and level in (0, 1), got {samples}, {level}")
    ma, mb = a.matrix, b.matrix
    if (ma.domains, ma.experiences) != (mb.domains, mb.experiences) or not (ma.is_complete and mb.is_complete):
        raise ValueError("difference_bootstrap: the runs must be complete and have the same domains and experiences")
    arr_a, arr_b = document_arrays(a), document_arrays(b)
    for d in ma.domains:
        if not np.array_equal(arr_a[d][1], arr_b[d][1]):
            raise ValueError(f"difference_bootstrap: domain {d!r}: the runs did not score the same documents "
                             "(token counts differ)")
    rng = np.random.default_rng(seed)
    rows = ma.num_experiences + 1
    weights = _weights(arr_a, ma.domains, samples, rng)
    da, db = _draw(arr_a, ma.domains, rows, weights), _draw(arr_b, mb.domains, rows, weights)

    def as_matrix(m: ResultsMatrix, values: np.ndarray) -> ResultsMatrix:
        return ResultsMatrix(m.domains, m.experiences, values, m.metric, m.lower_is_better)

    out = {}
    for name, f in scalars().items():
        diffs = [float(f(as_matrix(mb, y))) - float(f(as_matrix(ma, x))) for x, y in zip(da, db)]
        out[name] = _interval(float(f(mb)) - float(f(ma)), diffs, level)
    return {"samples": samples, "seed": seed, "level": level, "metrics": out}


def bootstrap(results: RunResults, samples: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Point value and percentile interval of every matrix cell, each experience's adaptation gain
    and the `scalars()`, over `samples` paired document draws."""
    if samples < 2 or not 0 < level < 1:
        raise ValueError(f"bootstrap: samples must be >= 2 and level in (0, 1), got {samples}, {level}")
    matrix = results.matrix
    arrays = document_arrays(results)
    rng = np.random.default_rng(seed)
    T1 = metrics.last_row(matrix) + 1
    drawn = _draw(arrays, matrix.domains, T1, _weights(arrays, matrix.domains, samples, rng))
    full = np.full((samples, matrix.num_experiences + 1, len(matrix.domains)), np.nan)
    full[:, :T1] = drawn
    tail = (1 - level) / 2

    def interval(value: float, values: list[float]) -> dict[str, float]:
        return _interval(value, values, level)

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
