"""`clp report PATH... [--out DIR]`: run, comparison or sweep folders → one self-contained HTML
report and its Markdown twin, from the folders' files alone (no model code, no torch).

    html, md = write_report(["runs/default-15a9b12c8fa9", "runs/default-602a7c423b18"])
    # runs/default-15a9b12c8fa9/report/report.html (+ report.md and its PNG files)

Sections: one per run (analysis/report_run.py), an overlay of the runs' forgetting curves when
there are several, one per comparison (report_comparison.py) and per sweep (report_sweep.py).
Runs with different domain sets are overlaid on the domains they share, and the report says so;
runs that share none are refused.

Everything is read, checked and drawn in memory before the first file is written, and each file
is written to a temporary name and renamed: a bad input leaves no report, not half of one.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from analysis import report_plots
from analysis.report_comparison import comparison_sections
from analysis.report_document import Document, Image, Paragraph, Section, to_html, to_markdown
from analysis.report_inputs import ComparisonInput, ReportInputError, RunInput, SweepInput, load_input
from analysis.report_run import boundaries, run_sections
from analysis.report_sweep import sweep_sections
from cl_platform.atomic import atomic_write, atomic_write_text


def shared_domains(runs: Sequence[RunInput]) -> tuple[list[str], Paragraph | None]:
    """The domains every run has (in the first run's order), and a note when the runs' domain sets
    differ; no shared domain at all is an error naming the runs' domains."""
    first = runs[0].results.matrix.domains
    shared = [d for d in first if all(d in r.results.matrix.domains for r in runs)]
    sets = "; ".join(f"{r.label}: {', '.join(r.results.matrix.domains)}" for r in runs)
    if not shared:
        raise ReportInputError(f"the runs share no domain, so their curves cannot be compared ({sets})")
    if all(r.results.matrix.domains == first for r in runs):
        return shared, None
    return shared, Paragraph(f"The runs have different domain sets ({sets}). The overlay below is aligned on the "
                             f"domains they share: {', '.join(shared)}; the others appear in each run's own section only.",
                             note=True)


def overlay_section(runs: Sequence[RunInput]) -> Section:
    domains, note = shared_domains(runs)
    curves = {d: {r.label: r.results.curves.get(d, []) for r in runs} for d in domains}
    same_steps = all(r.results.row_steps == runs[0].results.row_steps for r in runs)
    ends = boundaries(runs[0]) if same_steps else []
    if any(r.results.matrix.experiences != runs[0].results.matrix.experiences for r in runs):
        ends = [(step, f"end {t}") for t, (step, _) in enumerate(ends, start=1)]  # experience t differs by run
    blocks = [note] if note else []
    blocks += [Paragraph("Forgetting curves of every run, overlaid per shared domain"
                         + (" (dashed: experience ends)." if same_steps else
                            "; the runs end their experiences at different steps, so none is marked.")),
               Image("overlay-curves.png", report_plots.curves_png(curves, ends, runs[0].results.matrix.metric),
                     "forgetting curves of every run, per shared domain")]
    return Section("overlay", "Runs overlaid", blocks)


def build(paths: Sequence[str | Path], now: datetime.datetime | None = None) -> Document:
    if not paths:
        raise ReportInputError("no folder given: name one or more run, comparison or sweep folders")
    items = [load_input(p) for p in paths]
    runs = [item for item in items if isinstance(item, RunInput)]
    _unique_labels(runs)
    sections: list[Section] = []
    if len(runs) > 1:
        sections.append(overlay_section(runs))
    for item in items:
        if isinstance(item, RunInput):
            sections += run_sections(item)
        elif isinstance(item, ComparisonInput):
            sections += comparison_sections(item)
        elif isinstance(item, SweepInput):
            sections += sweep_sections(item)
    now = now or datetime.datetime.now(datetime.timezone.utc)
    kinds = {RunInput: "run", ComparisonInput: "comparison", SweepInput: "sweep"}
    header = [f"Report of {len(items)} folder(s): " + "; ".join(f"{kinds[type(i)]} {i.path}" for i in items),
              f"Made {now.strftime('%Y-%m-%d %H:%M:%S %Z')} by `clp report`, from the folders' files only."]
    return Document(title="cl-platform report", header=header, sections=sections)


def _unique_labels(runs: list[RunInput]) -> None:
    """Two runs named alike (same folder name under two roots) get their position appended."""
    names = [r.label for r in runs]
    for i, run in enumerate(runs):
        if names.count(run.label) > 1:
            run.label = f"{run.label} ({i + 1})"


def write_report(paths: Sequence[str | Path], out: str | Path | None = None,
                 now: datetime.datetime | None = None) -> tuple[Path, Path]:
    """Build the report and write `report.html`, `report.md` and the Markdown's PNG files into
    `out` (default: `<first path>/report/`). Returns (html path, markdown path)."""
    doc = build(paths, now)  # every input read and every figure drawn before anything is written
    html = to_html(doc)
    markdown, files = to_markdown(doc)
    folder = Path(out) if out is not None else Path(paths[0]) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write(folder / name, lambda f, data=data: f.write(data), binary=True)
    # The two reports last: whoever sees them finds the images they reference already there.
    atomic_write_text(folder / "report.md", markdown)
    atomic_write_text(folder / "report.html", html)
    return folder / "report.html", folder / "report.md"
