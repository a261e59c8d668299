"""The LOG's figure of the default sweep (issue 11): forgetting and adaptation gain of every complete
trial against the write step per token, eta / C, one marker per chunk size C.

    python experiments/figures/sweep_fast_lr_chunk.py runs/sweep-fast_lr_chunk [more sweep folders]

Reads each folder's trials.csv (written by `clp sweep`); writes sweep_fast_lr_chunk.png beside this
file and prints the trials sorted by eta / C.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


def trials(folders: list[str]) -> list[dict[str, float]]:
    rows, seen = [], set()
    for folder in folders:
        with open(Path(folder) / "trials.csv", newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row["state"] != "COMPLETE":
                    continue
                eta, chunk = float(row["cl.fwpkm.lr_values"]), int(row["cl.fwpkm.chunk"])
                if (eta, chunk) in seen:  # the same setting twice (a study re-run with the same seed)
                    continue
                seen.add((eta, chunk))
                rows.append({"eta": eta, "chunk": chunk, "step": eta / chunk,
                             "forgetting": float(row["average_forgetting"]), "gain": float(row["adaptation_gain"]),
                             "final": float(row["average_final"])})
    return sorted(rows, key=lambda r: r["step"])


def main(folders: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = trials(folders)
    print(f"{'eta':>7} {'C':>4} {'eta/C':>9} {'forgetting':>10} {'gain':>7} {'final':>7}")
    for r in rows:
        print(f"{r['eta']:7.3f} {r['chunk']:4d} {r['step']:9.2e} {r['forgetting']:10.4f} {r['gain']:7.4f} {r['final']:7.4f}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    markers = {32: "v", 64: "s", 128: "o", 256: "D", 512: "^"}
    for ax, key, label in ((axes[0], "forgetting", "average forgetting (nats)"), (axes[1], "gain", "adaptation gain (nats)")):
        for chunk, marker in markers.items():
            pts = [r for r in rows if r["chunk"] == chunk]
            if pts:
                ax.scatter([r["step"] for r in pts], [r[key] for r in pts], marker=marker, label=f"C = {chunk}")
        ax.set_xscale("log")
        ax.set_xlabel("write step per token, eta / C")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("default sweep, dev split, base 0: every complete trial")
    out = Path(__file__).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"figure: {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
