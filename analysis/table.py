"""Plain-text rendering of a results matrix: one row per experience, one column per domain.

    loss (lower is better)  math    law
    0 before               3.210  3.400
    1 math                 2.100* 3.500
    2 law                  2.600  2.200*

`*` marks the domain the row's experience trained; `-` marks a cell not measured (a run killed
part-way).

Every printed table formats its numbers through `number` and `interval`, so that a number that does
not exist (a metric undefined on a short stream, a spread over one seed) reads `n/a (why)`, never
`nan`; results.json keeps the NaN.
"""

import math

from cl_platform.results import ResultsMatrix, RunResults

# A spread (std, t-interval) over one seed does not exist.
ONE_SEED = "n/a (1 seed)"


def number(value: float | None, spec: str = "+.4f", undefined: str = "n/a") -> str:
    """`value` formatted by `spec`, or `undefined` where there is none (None, NaN)."""
    if value is None or math.isnan(value):
        return undefined
    return format(value, spec)


def interval(low: float | None, high: float | None, spec: str = "+.4f", undefined: str = "n/a") -> str:
    """`[low, high]`, or `[undefined]` where an end is missing."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return f"[{undefined}]"
    return f"[{low:{spec}}, {high:{spec}}]"


def format_table(results: ResultsMatrix | RunResults, precision: int = 3) -> str:
    """The matrix as aligned text, rows "t domain" (row 0: "0 before"), one column per domain."""
    matrix = results.matrix if isinstance(results, RunResults) else results
    better = "lower" if matrix.lower_is_better else "higher"
    corner = f"{matrix.metric} ({better} is better)"
    labels = ["0 before"] + [f"{t} {name}" for t, name in enumerate(matrix.experiences, start=1)]

    cells = []
    for t, row in enumerate(matrix.values):
        trained = matrix.trained_domain(t) if t > 0 else None
        cells.append(
            [
                ("-" if math.isnan(v) else f"{v:.{precision}f}")
                + ("*" if domain == trained else " ")
                for domain, v in zip(matrix.domains, row.tolist())
            ]
        )

    label_width = max(len(corner), *(len(label) for label in labels))
    # Each cell carries a one-character marker column ('*' or space), so the domain names are
    # right-aligned against the number, not the marker.
    widths = [
        max(len(domain) + 1, *(len(row[j]) for row in cells))
        for j, domain in enumerate(matrix.domains)
    ]
    lines = [
        corner.ljust(label_width)
        + "".join(" " + (domain + " ").rjust(w) for domain, w in zip(matrix.domains, widths))
    ]
    for label, row in zip(labels, cells):
        lines.append(
            label.ljust(label_width) + "".join(" " + cell.rjust(w) for cell, w in zip(row, widths))
        )
    return "\n".join(line.rstrip() for line in lines)
