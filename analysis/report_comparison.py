"""The report's section for a `clp compare` folder (comparison.json):

    table    entries × headline metrics, mean ± std over seeds, as comparison.json holds them
    paired   every entry against the first: differences and the fractions targets are set in
             (forgetting cut, gain kept), with the interval the comparison supports
             (analysis/paired.py: over bases, over pairs, or over documents within one base)
    curves   forgetting curves per domain, one line per entry: the mean over its seeds, each seed's
             curve read from the member run's results.json
    scatter  average forgetting against adaptation gain per entry, error bars = std over seeds, the
             Pareto front (entries no other entry beats on both: more gain and less forgetting)
             drawn as a line and named in the text

The members' own sections are not repeated (one report per member run: `clp report <member>`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analysis import metrics, paired, report_plots
from analysis.bootstrap import few_documents_note
from analysis.report_document import Image, Paragraph, Section, Table, num
from analysis.report_inputs import ComparisonInput, RunInput
from analysis.table import ONE_SEED, interval
from analysis.report_run import boundaries


def columns() -> dict[str, tuple[str, bool]]:
    """comparison.json's per-entry statistics, in the order `clp compare` prints them
    (analysis.metrics.COMPARISON_TABLE): name -> (column head, shown signed)."""
    return {m.name: (m.column_label, m.signed) for m in metrics.comparison_columns()}


def mean_std(stat: dict[str, Any] | None, digits: int = 4, sign: bool = False, undefined: str = "n/a") -> str:
    """`mean ± std` as a cell; `undefined` where the metric has no value (e.g. retention 2
    experiences later on a 2-experience stream), `n/a (1 seed)` for the std of one seed."""
    if not isinstance(stat, dict) or not isinstance(stat.get("mean"), (int, float)) or math.isnan(stat["mean"]):
        return undefined
    std = stat.get("std")
    spread = ONE_SEED if not isinstance(std, (int, float)) or math.isnan(std) else num(std, digits)
    return f"{num(stat.get('mean'), digits, sign)} ± {spread}"


def mean_curve(runs: list[RunInput], domain: str) -> list[tuple[int, float]]:
    """The mean over seeds of one domain's curve, over the points whose step every seed shares (same
    position in every curve: seeds of one entry run the same steps)."""
    curves = [run.results.curves.get(domain, []) for run in runs]
    out = []
    for i in range(min(len(c) for c in curves) if curves else 0):
        steps = {c[i][0] for c in curves}
        if len(steps) != 1:
            break
        out.append((curves[0][i][0], float(np.mean([c[i][1] for c in curves]))))
    return out


def comparison_sections(comp: ComparisonInput) -> list[Section]:
    entries = comp.data["entries"]
    seeds = comp.data.get("seeds")
    table = columns()
    rows = []
    for entry, row in entries.items():
        rows.append([entry, str(row.get("mode")), str(row.get("strategy")), ", ".join(map(str, row.get("seeds", []))),
                     *[mean_std(row.get(key), sign=signed, undefined=metrics.METRICS[key].undefined_text)
                       for key, (_, signed) in table.items()],
                     mean_std(row.get("final_perplexity"), 2),
                     f"{num(row.get('relative_compute'), 2)}x",
                     "n/a (no checkpoint kept)" if row.get("state_bytes") is None else str(row["state_bytes"]),
                     str(row.get("stored_tokens", "–"))])  # older comparison.json files lack it
    heads = ["entry", "mode", "strategy", "seeds", *[label for label, _ in table.values()], "final perplexity",
             "relative compute", "state bytes", "training tokens kept"]
    blocks: list = [
        Paragraph(f"Folder: {comp.path}. Seeds {seeds}; every cell is mean ± std over seeds (sample std; n/a with "
                  "one seed), loss in nats; compute = train + eval time relative to the first entry of the same mode."),
        Table("comparison-table", heads, rows, "strategies × metrics (comparison.json)"),
    ]
    blocks += paired_blocks(entries, len(comp.data.get("base_seeds") or []))
    runs = [run for members in comp.members.values() for run in members]
    if runs and paired.paired_rows(entries) and paired.is_within(entries):  # intervals over these documents
        note = few_documents_note({d: len(docs) for d, docs in runs[0].results.doc_losses.get("0", {}).items()})
        if note is not None:
            blocks.append(Paragraph(f"Intervals {note}.", note=True))
    if comp.missing:
        blocks.append(Paragraph(f"Member run folders not found (their curves are left out): {', '.join(comp.missing)}",
                                note=True))
    blocks += curve_blocks(comp)
    x, y = (metrics.METRICS[name] for name in metrics.TRADE_OFF)
    points = [(entry, _get(row, x.name, "mean"), _get(row, x.name, "std"), _get(row, y.name, "mean"),
               _get(row, y.name, "std")) for entry, row in entries.items()]
    front = pareto_front([(entry, gain, forgetting) for entry, gain, _, forgetting, _ in points])
    blocks += [Paragraph("Forgetting against adaptation: right = more gain on the trained domain, down = less "
                         "forgetting; error bars: std over seeds. Pareto front (no other entry has at least as "
                         f"much gain and at most as much forgetting, one of them strictly; on the means): "
                         f"{', '.join(front) if front else 'none (no entry has both numbers)'}."),
               Image("comparison-scatter.png",
                     report_plots.scatter_png(points, f"{x.column_label} (nats)", f"{y.column_label} (nats)", front),
                     f"{y.column_label} against {x.column_label} per entry, Pareto front as a line")]
    blocks += held_out_blocks(entries, x)
    return [Section("comparison", "Comparison", blocks)]


def held_out_blocks(entries: dict[str, dict[str, Any]], x: "metrics.Metric") -> list:
    """The second forgetting axis against the gain: what each entry did to the domains no experience
    trains (the base's general text on the reference stream); none when no entry has such a domain."""
    h = metrics.METRICS[metrics.HELD_OUT]
    points = [(entry, _get(row, x.name, "mean"), _get(row, x.name, "std"), _get(row, h.name, "mean"),
               _get(row, h.name, "std")) for entry, row in entries.items()]
    if all(math.isnan(p[3]) for p in points):
        return []
    # Higher is better on both axes: the front of (gain, -change) under the lower-is-better rule.
    front = pareto_front([(entry, gain, -change) for entry, gain, _, change, _ in points])
    return [Paragraph("Held-out text against adaptation: right = more gain on the trained domain, up = the "
                      "domains no experience trains got better (down: worse); error bars: std over seeds. "
                      f"Pareto front: {', '.join(front) if front else 'none (no entry has both numbers)'}."),
            Image("comparison-held-out.png",
                  report_plots.scatter_png(points, f"{x.column_label} (nats)", f"{h.column_label} (nats)", front),
                  f"{h.column_label} against {x.column_label} per entry, Pareto front as a line")]


def paired_blocks(entries: dict[str, dict[str, Any]], bases: int) -> list:
    """Every entry against the first, as `clp compare` prints it (none for a one-entry comparison)."""
    rows = paired.paired_rows(entries)
    if not rows:
        return []
    first, within = next(iter(entries)), paired.is_within(entries)
    table = columns()

    def cell(c: tuple[float, float, float] | None) -> str:
        if c is None or math.isnan(c[0]):
            return "n/a"
        return f"{num(c[0], 4, True)} {interval(c[1], c[2], '+.3f')}"

    out = []
    for entry, row in rows:
        diff, frac = paired.difference_cells(row, within), paired.fraction_cells(row, within)
        out.append([entry, *[cell(diff.get(key)) for key in table],
                    *[paired.percent_cell(frac[name]) if name in frac else "n/a" for name in paired.FRACTIONS]])
    heads = ["entry", *[f"Δ {label}" for label, _ in table.values()], *paired.FRACTIONS.values()]
    fixed = f"; the fractions' interval holds {first}'s value fixed" if within else ""
    return [Paragraph(f"Against {first}, member by member (same base, order and seed): Δ = entry − {first}; "
                      f"forgetting cut = 1 − forgetting / {first}'s, gain kept = gain / {first}'s (with several "
                      f"bases, each base's ratio of its members' means). Intervals: "
                      f"{paired.interval_label(entries, bases)}{fixed}."),
            Table("comparison-paired", heads, out, f"entries against {first} (comparison.json)")]


def pareto_front(points: list[tuple[str, float, float]]) -> list[str]:
    """The entries (label, gain, forgetting) that no other entry dominates (gain ≥ and forgetting ≤,
    one strictly), ordered by gain; entries with a NaN are left out."""
    ok = [(label, g, f) for label, g, f in points if not (math.isnan(g) or math.isnan(f))]
    front = [(label, g, f) for label, g, f in ok
             if not any(g2 >= g and f2 <= f and (g2 > g or f2 < f) for _, g2, f2 in ok)]
    return [label for label, _, _ in sorted(front, key=lambda p: p[1])]


def curve_blocks(comp: ComparisonInput) -> list:
    if not comp.members:
        return []
    runs = [run for members in comp.members.values() for run in members]
    domains = [d for d in runs[0].results.matrix.domains if all(d in r.results.matrix.domains for r in runs)]
    curves = {d: {entry: mean_curve(members, d) for entry, members in comp.members.items()} for d in domains}
    if not any(points for by_entry in curves.values() for points in by_entry.values()):
        return []
    # Experience ends are drawn only when every member ended its experiences at the same steps.
    same_steps = all(r.results.row_steps == runs[0].results.row_steps for r in runs)
    figure = report_plots.curves_png(curves, boundaries(runs[0]) if same_steps else [], runs[0].results.matrix.metric)
    return [Paragraph("Forgetting curves per domain, one line per entry: the mean over its seeds."),
            Image("comparison-curves.png", figure, "forgetting curves per entry, mean over seeds")]


def _get(row: dict[str, Any], key: str, stat: str) -> float:
    value = (row.get(key) or {}).get(stat)
    return float(value) if isinstance(value, (int, float)) else math.nan
