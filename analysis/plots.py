"""Plots of run results (matplotlib, files only): built from the results alone, no model code.

    fig = heatmap_figure(RunResults.from_json("runs/default-…/results.json").matrix)
    fig.savefig("matrix.png")
"""

from __future__ import annotations

from cl_platform.results import ResultsMatrix


def heatmap_figure(matrix: ResultsMatrix):
    """Two panels: R[t, j] as measured, and R[t, j] − R[0, j] (change since before the stream).

    The domains' own difficulty dominates the first panel (web is hard whatever happened), so
    forgetting and adaptation are read on the second, with a diverging colour scale centred on 0:
    red = worse than before the stream, blue = better. Every measured cell is annotated."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt
    import numpy as np

    values = matrix.values
    delta = values - values[:1]
    worse = delta if matrix.lower_is_better else -delta  # > 0: worse than before the stream
    rows = ["0 before"] + [f"{t} {d}" for t, d in enumerate(matrix.experiences, start=1)]
    width = 1.1 * len(matrix.domains)
    fig, axes = plt.subplots(1, 2, figsize=(2.8 + 2 * width, 1.0 + 0.45 * len(rows)))
    finite = worse[np.isfinite(worse)]
    span = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    panels = (
        (values, "viridis_r" if matrix.lower_is_better else "viridis", None, matrix.metric, "{:.2f}"),
        (worse, "RdBu_r", (-span, span), f"{matrix.metric}: change since row 0 (red = worse)", "{:+.3f}"),
    )
    for ax, (shown, cmap, limits, label, fmt) in zip(axes, panels):
        image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, aspect="auto",
                          **({} if limits is None else {"vmin": limits[0], "vmax": limits[1]}))
        ax.set_xticks(range(len(matrix.domains)), matrix.domains)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("evaluated domain")
        fig.colorbar(image, ax=ax, label=label)
        cell = delta if shown is worse else values
        for t in range(values.shape[0]):
            for j in range(values.shape[1]):
                if np.isfinite(shown[t, j]):
                    r, g, b, _ = image.cmap(image.norm(shown[t, j]))
                    dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # light text on dark cells
                    ax.text(j, t, fmt.format(cell[t, j]), ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
    axes[0].set_ylabel("after experience")
    fig.tight_layout()
    return fig
