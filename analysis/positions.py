"""Losses by position in the document, for long-context perplexity (numpy only).

    sums, counts = bucket_document_sums(losses, positions, doc_index, valid, edges)   # (docs, buckets)
    table = bucket_means(sums, counts)                                                # (buckets,)
    ci = paired_difference(sums_a, counts_a, sums_b, counts_b)                        # B − A per bucket

A token's position is how many tokens of its own document precede it in the segment the model
read (`experiments.studies.longctx.context_positions`): with a sliding-window model, positions below the
window are tokens whose whole document context is visible to attention, positions beyond it are
tokens for which only a memory can bring back the start of the document. Buckets are half-open
ranges [edges[i], edges[i+1]). Every token falls into exactly one bucket, so the buckets' sums
and counts add up to the whole split's (tested against the model's own mean loss).

Intervals: a paired bootstrap over documents, as `analysis/bootstrap.py` does for runs: every
variant and setting reads the same documents, so one draw of documents applies to both sides of a
difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def bucket_of(positions: np.ndarray, edges: list[int]) -> np.ndarray:
    """Bucket index of each position (edges[i] <= p < edges[i+1]); -1 outside [edges[0], edges[-1])."""
    positions = np.asarray(positions)
    b = np.searchsorted(np.asarray(edges), positions, side="right") - 1
    b[(positions < edges[0]) | (positions >= edges[-1])] = -1
    return b


def bucket_document_sums(losses: np.ndarray, positions: np.ndarray, doc_index: np.ndarray, valid: np.ndarray,
                         edges: list[int], n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Σ loss and token count per (document, bucket) over the valid tokens; arrays (n_docs, buckets)."""
    losses, positions, doc_index, valid = (np.asarray(a).reshape(-1) for a in (losses, positions, doc_index, valid))
    b = bucket_of(positions, edges)
    keep = valid & (b >= 0) & (doc_index >= 0)
    if int((valid & (b < 0)).sum()):
        raise ValueError(f"positions outside the buckets {edges}: max position {int(positions[valid].max())}")
    n_buckets = len(edges) - 1
    flat = doc_index[keep] * n_buckets + b[keep]
    sums = np.bincount(flat, weights=losses[keep], minlength=n_docs * n_buckets).reshape(n_docs, n_buckets)
    counts = np.bincount(flat, minlength=n_docs * n_buckets).reshape(n_docs, n_buckets)
    return sums, counts


def bucket_means(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-token mean loss of each bucket over all documents (nan for an empty bucket)."""
    total = counts.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, sums.sum(0) / np.maximum(total, 1), np.nan)


def paired_difference(sums_a: np.ndarray, counts_a: np.ndarray, sums_b: np.ndarray, counts_b: np.ndarray,
                      samples: int = 1000, seed: int = 0, level: float = 0.95) -> list[dict[str, Any]]:
    """Per bucket: B − A (mean loss) with a percentile interval over resampled documents."""
    if sums_a.shape != sums_b.shape or not np.array_equal(counts_a, counts_b):
        raise ValueError("paired_difference: both sides must score the same documents and tokens")
    value = bucket_means(sums_b, counts_b) - bucket_means(sums_a, counts_a)
    rng = np.random.default_rng(seed)
    n = sums_a.shape[0]
    draws = []
    for _ in range(samples):
        pick = rng.integers(0, n, n)
        draws.append(bucket_means(sums_b[pick], counts_b[pick]) - bucket_means(sums_a[pick], counts_a[pick]))
    draws = np.asarray(draws)
    tail = 100 * (1 - level) / 2
    low, high = np.nanpercentile(draws, tail, axis=0), np.nanpercentile(draws, 100 - tail, axis=0)
    return [{"value": float(v), "low": float(lo), "high": float(hi), "tokens": int(c)}
            for v, lo, hi, c in zip(value, low, high, counts_a.sum(0))]


def positions_figure(table: dict[str, dict[str, dict[str, list[float]]]], edges: list[int], window: int):
    """One panel per domain: mean loss per position bucket, a line per variant, solid with writes
    on and dashed with writes off. `table[domain][variant][setting]` = per-bucket means."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    domains = list(table)
    fig, axes = plt.subplots(1, len(domains), figsize=(3.6 * len(domains), 3.4), squeeze=False)
    mids = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:])]
    labels = [f"{lo}-{hi}" for lo, hi in zip(edges[:-1], edges[1:])]
    for ax, domain in zip(axes[0], domains):
        for i, (variant, settings) in enumerate(table[domain].items()):
            colour = f"C{i}"
            for setting, style in (("on", "-"), ("off", "--")):
                if setting in settings:
                    ax.plot(mids, settings[setting], style, color=colour, marker="o", ms=3,
                            label=f"{variant} (writes {setting})" if setting == "on" or "on" not in settings else None)
        ax.axvline(window, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xticks(mids, labels, rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_title(domain)
        ax.set_xlabel("position in document (tokens)")
    axes[0][0].set_ylabel("loss (nats/token)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"loss by position; dotted: attention window ({window}); dashed: writes off", fontsize=9)
    fig.tight_layout()
    return fig
