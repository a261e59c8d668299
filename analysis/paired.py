"""A comparison's entries against its first entry, as (value, low, high) cells with the interval
the comparison supports: over the bases (several bases, each the mean of its own orders and
seeds), over the pairs (one base, several orders or seeds), or over the documents both runs
scored (one base, one pair: a within-base interval). `clp compare`'s text table and the HTML
report print the same cells from `comparison.json`'s entries.

    within = is_within(entries)
    cells = difference_cells(entries["slot_freezing"], within)   # {"average_forgetting": (-0.21, -0.32, -0.11), ...}
    cut = fraction_cells(entries["slot_freezing"], within)["forgetting_cut"]
"""

from __future__ import annotations

import math
from typing import Any

Cell = tuple[float, float, float]
FRACTIONS = {"forgetting_cut": "forgetting cut", "gain_kept": "gain kept"}


def paired_rows(entries: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The entries that carry a paired difference (every one but the first)."""
    return [(entry, row) for entry, row in entries.items() if row.get("vs_first")]


def pairs_of(entries: dict[str, dict[str, Any]]) -> int:
    rows = paired_rows(entries)
    return len(next(iter(rows[0][1]["vs_first"].values()))["values"]) if rows else 0


def is_within(entries: dict[str, dict[str, Any]]) -> bool:
    """One base and one seed: the only interval is the documents' (within that base)."""
    return pairs_of(entries) == 1


def clustered(entries: dict[str, dict[str, Any]]) -> bool:
    """Several pairs per base on several bases: the intervals are over the bases."""
    return any("over_bases" in d for _, row in paired_rows(entries) for d in row["vs_first"].values())


def difference_cells(row: dict[str, Any], within: bool) -> dict[str, Cell]:
    """Per metric, entry − first: the point and its interval."""
    if within:
        return {m: (d["value"], d["low"], d["high"]) for m, d in row.get("vs_first_documents", {}).items()}
    return {m: (d["mean"], *d.get("over_bases", d)["t95"]) for m, d in row["vs_first"].items()}


def fraction_cells(row: dict[str, Any], within: bool) -> dict[str, Cell]:
    """`forgetting_cut` (1 − F / F_first) and `gain_kept` (G / G_first): the point and its interval
    (comparison.json files written before stop 38 have none)."""
    out = {}
    for name, d in row.get("relative", {}).items():
        low, high = (d["documents"]["low"], d["documents"]["high"]) if within and "documents" in d else d["t95"]
        out[name] = (d["mean"], low, high)
    return out


def percent_cell(c: Cell) -> str:
    """A fraction cell as printed: `58.0 % [43.0, 73.0]` (`n/a` for a fraction of nothing, `[n/a]` for
    an interval over one pair)."""
    if math.isnan(c[0]):
        return "n/a"
    ends = "[n/a]" if math.isnan(c[1]) or math.isnan(c[2]) else f"[{100 * c[1]:.1f}, {100 * c[2]:.1f}]"
    return f"{100 * c[0]:.1f} % {ends}"


def interval_label(entries: dict[str, dict[str, Any]], bases: int) -> str:
    """What the intervals of `difference_cells` are over, in words."""
    pairs = pairs_of(entries)
    if pairs == 1:
        return "one base and seed: 95 % paired bootstrap over evaluation documents, within this base"
    if clustered(entries):
        return f"95 % t-interval over the {bases} bases, each the mean of its {pairs // max(bases, 1)} pairs"
    return f"95 % t-interval over the {pairs} pairs"
