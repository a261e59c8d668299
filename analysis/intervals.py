"""The intervals the studies quote, each defined once (numpy and scipy only).

    wilson(15, 100)                          # (0.0931, 0.2328): a proportion k / n, e.g. exact match
    mean_and_std([0.5, 0.6])                 # (0.55, 0.0707): std 0.0 for one value
    mean_of([0.5, None, 0.7])                # 0.6: the mean of the values that exist
    bootstrap_mean(values, samples=1000)     # [low, high]: the mean over episodes, resampled
    paired_bootstrap(reference, other)       # {"value", "low", "high"}: other − reference, the same draws
    mean_std([0.10, 0.06, 0.11])             # {"mean", "std", "t95", "cv", "values"}: Student t over bases

Which to quote: within one base the unit is its episodes (or documents), so a proportion gets a
Wilson interval and a mean or a paired difference a percentile bootstrap over them; over several
pretraining seeds the unit is the base, and the interval is Student t over the bases' values
(`mean_std`, defined in `analysis/aggregate.py` for runs over seeds and used here as it is).
The document bootstrap of a run's matrix is `analysis/bootstrap.py`; of losses by position,
`analysis/positions.py`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any
import numpy as np

from analysis.aggregate import mean_std  # the t-interval over bases: one definition, re-exported
from analysis.positions import paired_difference

__all__ = ["bootstrap_mean", "interval_text", "mean_and_std", "mean_of", "mean_std", "over_bases_text", "paired_bootstrap",
           "wilson"]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k / n (z = 1.96: 95 %); (nan, nan) for n = 0."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, mid - half), min(1.0, mid + half))


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std of `values`, the std 0.0 for one value (a table's `mean ± std` over
    seeds; `mean_std` gives NaN there instead, where an interval is asked for)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_of(values: Sequence[float | None]) -> float | None:
    """The mean of the values that exist (None: e.g. one needle has no others to compare with);
    None when none does."""
    kept = [x for x in values if x is not None]
    return statistics.fmean(kept) if kept else None


def _quantiles(level: float) -> tuple[float, float]:
    """The two tails' quantiles of a central `level` interval, exact for round levels (0.95 →
    0.025 and 0.975, as a literal would be: (1 − 0.95) / 2 is not 0.025 in floating point)."""
    percent = round(100 * level, 9)
    return (100 - percent) / 200, (100 + percent) / 200


def bootstrap_mean(values: Sequence[float], samples: int, seed: int = 0, level: float = 0.95) -> list[float]:
    """Percentile bootstrap interval [low, high] of the mean of `values` (e.g. one base's episodes):
    `samples` draws of len(values) values with replacement from a generator seeded `seed`."""
    a = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, len(a), size=(samples, len(a)))].mean(axis=1)
    low, high = _quantiles(level)
    return [float(np.quantile(means, low)), float(np.quantile(means, high))]


def paired_bootstrap(reference: Sequence[Sequence[float]], other: Sequence[Sequence[float]], samples: int = 2000,
                     seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """`other` minus `reference` on the same episodes (each a list of runs, a run a list of
    per-episode scores; each side's runs averaged per episode first), with a percentile interval
    over episodes drawn with replacement, the same draw for both sides: within one base."""
    a = np.asarray(reference, dtype=np.float64).mean(0)
    b = np.asarray(other, dtype=np.float64).mean(0)
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: {a.size} reference episodes against {b.size}")
    ones = np.ones((a.size, 1))  # each episode one "document" of one scored answer
    d = paired_difference(a[:, None], ones, b[:, None], ones, samples=samples, seed=seed, level=level)[0]
    return {k: d[k] for k in ("value", "low", "high")}


def interval_text(value: float, low: float, high: float, spec: str = ".2f") -> str:
    """`value [low, high]` in format `spec`: how every study's table prints a point and its interval."""
    return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


def over_bases_text(stat: dict[str, Any] | None, spec: str = ".2f") -> str:
    """A `mean_std` over bases as a table cell: `mean [t95] (each base's value)`, the value alone
    for one base, `n/a` for none."""
    if stat is None:
        return "n/a"
    values = " / ".join(f"{v:{spec}}" for v in stat["values"])
    return values if len(stat["values"]) < 2 else f"{interval_text(stat['mean'], *stat['t95'], spec=spec)} ({values})"
