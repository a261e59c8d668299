"""The report's figures as PNG bytes (matplotlib, Agg backend: files only, never a window).

Each function draws one kind of figure from plain numbers, so the report decides what to plot and
these only decide how. The results heatmap is `analysis.plots.heatmap_figure`, the one TensorBoard
shows, not redrawn here.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from cl_platform.results import ResultsMatrix

Points = Sequence[tuple[int, float]]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def to_png(fig) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def matrix_png(matrix: ResultsMatrix) -> bytes:
    from analysis.plots import heatmap_figure

    return to_png(heatmap_figure(matrix))


def curves_png(curves: dict[str, dict[str, Points]], boundaries: Sequence[tuple[int, str]], ylabel: str) -> bytes:
    """One panel per domain (`curves[domain][series label]` = points), the series overlaid;
    dashed vertical lines at `boundaries` (step, label): where each experience ended."""
    plt = _pyplot()
    domains = list(curves)
    cols = min(len(domains), 2)
    rows = math.ceil(len(domains) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.2 * rows), squeeze=False)
    for ax, domain in zip(axes.flat, domains):
        for label, points in curves[domain].items():
            if points:
                ax.plot([s for s, _ in points], [v for _, v in points], marker=".", label=label)
        for step, name in boundaries:
            ax.axvline(step, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(name, (step, 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="grey",
                        ha="right", va="top", rotation=90)
        ax.set_title(domain)
        ax.set_xlabel("run step")
        ax.set_ylabel(ylabel)
        if len(curves[domain]) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(domains):]:
        ax.set_visible(False)
    fig.tight_layout()
    return to_png(fig)


def scatter_png(points: Sequence[tuple[str, float, float, float, float]], xlabel: str, ylabel: str,
                front: Sequence[str] = ()) -> bytes:
    """(label, x, x error, y, y error) per point; a NaN error (one seed) draws no bar. `front`: labels
    joined by a dashed line in the given order (a Pareto front)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.5))
    at = {label: (x, y) for label, x, _, y, _ in points}
    if len(front) > 1:
        ax.plot([at[label][0] for label in front], [at[label][1] for label in front], "--", color="black",
                linewidth=0.8, label="Pareto front", zorder=0)
    for label, x, xerr, y, yerr in points:
        ax.errorbar([x], [y], xerr=None if math.isnan(xerr) else [xerr], yerr=None if math.isnan(yerr) else [yerr],
                    fmt="o", capsize=3, label=label)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    return to_png(fig)


def per_experience_png(series: dict[str, dict[str, list[float]]], experiences: Sequence[str]) -> bytes:
    """One panel per statistic (`series[stat][line label]` = one value per experience)."""
    plt = _pyplot()
    stats = list(series)
    fig, axes = plt.subplots(1, len(stats), figsize=(4.0 * len(stats), 3.2), squeeze=False)
    ticks = list(range(1, len(experiences) + 1))
    for ax, stat in zip(axes.flat, stats):
        for label, values in series[stat].items():
            ax.plot(ticks[:len(values)], values, marker="o", label=label)
        ax.set_xticks(ticks, [f"{t} {d}" for t, d in zip(ticks, experiences)], rotation=30, fontsize=8)
        ax.set_title(stat)
        if len(series[stat]) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return to_png(fig)


def history_png(trials: Sequence[tuple[int, float]], direction: str | None, name: str) -> bytes:
    """Objective value per trial number, with the best so far when the direction is known."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.5))
    ax.plot([n for n, _ in trials], [v for _, v in trials], "o", label=name)
    if direction in ("minimize", "maximize"):
        best, line = None, []
        for _, v in trials:
            best = v if best is None else (min(best, v) if direction == "minimize" else max(best, v))
            line.append(best)
        ax.step([n for n, _ in trials], line, where="post", label=f"best so far ({direction})")
    ax.set_xlabel("trial")
    ax.set_ylabel(name)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return to_png(fig)


def bars_png(values: dict[str, float], xlabel: str) -> bytes:
    """Horizontal bars, largest on top (parameter importances)."""
    plt = _pyplot()
    names = sorted(values, key=values.get)
    fig, ax = plt.subplots(figsize=(6.0, 0.6 + 0.4 * len(names)))
    ax.barh(names, [values[n] for n in names])
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    return to_png(fig)


def pareto_png(points: Sequence[tuple[int, float, float]], front: set[int], names: tuple[str, str]) -> bytes:
    """(trial, objective 1, objective 2) per trial; the Pareto-front trials highlighted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.5))
    rest = [p for p in points if p[0] not in front]
    best = [p for p in points if p[0] in front]
    ax.scatter([p[1] for p in rest], [p[2] for p in rest], color="grey", label="trials")
    ax.scatter([p[1] for p in best], [p[2] for p in best], color="tab:red", label="Pareto front")
    for n, x, y in points:
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.legend(fontsize=8)
    fig.tight_layout()
    return to_png(fig)
