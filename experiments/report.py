"""`clp report PATH... [--out DIR]`: the report of run, comparison or sweep folders, built by
`analysis.report` from the folders' files (no model is loaded); this module only prints where it
went.

    clp report runs/default-15a9b12c8fa9                       # → runs/default-…/report/report.html + .md
    clp report runs/default-15a9b12c8fa9 runs/default-602a7c423b18 --out /tmp/two-runs
    clp report runs/compare-strategies-13bf4a95f2d4
    clp report runs/sweep-fast_lr_chunk
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def main(paths: Sequence[str], out: str | None = None) -> int:
    from analysis.report import write_report

    html, md = write_report(paths, out)
    print(f"report: {html}")
    print(f"        {md} (+ its PNG files in {Path(md).parent})")
    return 0
