"""`clp report` on real tiny runs (conftest's `tiny` stream and base): one comparison (naive and
slot_freezing × 2 seeds, whose slot_freezing seed-0 member is also the single run reported), one run
on another stream (math + web, no FwPKM layer, finetune) and two small sweeps, made once per module.

What is checked: each report has the sections its data supports and no other; the HTML tables, the
Markdown twin and TensorBoard show the numbers results.json / comparison.json / trials.csv hold;
images decode; nothing external is referenced; bad inputs are refused, naming the path, with no
report written; the report code runs with the torch stack unimportable.
"""
import base64
import csv
import io
import json
import math
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from analysis.metrics import METRICS, summary
from analysis.report import write_report
from analysis.report_document import slug
from analysis.report_inputs import ReportInputError
from analysis.report_run import shown_path
from cl_platform.results import RunResults, perplexity

ROOT = Path(__file__).resolve().parents[2]


def quiet(_):
    pass


# --- fixtures: real tiny runs, a comparison and sweeps, made once --------------------------------
def _comparison(tiny, folder: Path) -> Path:
    from experiments.multi.compare import load, run

    tiny.config(folder / "run.yaml")
    spec = {"run": "run.yaml", "name": "report", "seeds": [0, 1],
            "entries": {"naive": ["strategy.name=naive"],
                        "freeze": ["strategy.name=slot_freezing", "strategy.kwargs={fraction: 0.2, budget: 0.5}"]}}
    (folder / "compare.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    out, _ = run(load(folder / "compare.yaml"), say=quiet)
    return out


def _other_domains_run(tiny, folder: Path) -> Path:
    """math + web instead of math + code; no FwPKM layer (so no memory section), finetune mode."""
    from experiments.run import execute

    web = {"name": "web", "source": "corpus:web", "filters": {"max_documents": 60}}
    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache"), "domains": [tiny.stream_spec["domains"][0], web]}
    stream = tiny.write_yaml(folder / "stream.yaml", spec)
    cfg = tiny.config(folder / "web.yaml", stream=str(stream), model={"fwpkm_layers": []}, cl={"mode": "finetune"})
    run_dir, _, _ = execute(cfg, progress_bar=False, say=quiet)
    return run_dir


def _sweep(tiny, folder: Path, name: str, objective: dict) -> Path:
    """Two trials on the tiny stream with a dev split (same base), as tests/experiments/multi/test_sweep.py."""
    from experiments.multi import sweep

    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache")}
    spec["token_budget"] = {**spec["token_budget"], "dev": 256}
    stream = tiny.write_yaml(folder / "stream.yaml", spec)
    tiny.config(folder / "run.yaml", stream=str(stream))
    data = {"run": "run.yaml", "name": name, "trials": 2, "sampler": "random", "seed": 0,
            "space": {"cl.fwpkm.lr_values": {"type": "float", "low": 0.03, "high": 3.0, "log": True}},
            "objective": objective, "pruner": {"name": "none"}}
    (folder / "sweep.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    out, _ = sweep.run(folder / "sweep.yaml", say=quiet)
    return out


@pytest.fixture(scope="module")
def made(tiny, tiny_base, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    for name in ("compare", "web", "sweep1", "sweep2"):
        (root / name).mkdir()
    comparison = _comparison(tiny, root / "compare")
    members = json.loads((comparison / "comparison.json").read_text())["members"]
    return SimpleNamespace(
        root=root, comparison=comparison, run=Path(members["freeze"][0]["folder"]),
        naive=Path(members["naive"][0]["folder"]), web=_other_domains_run(tiny, root / "web"),
        sweep=_sweep(tiny, root / "sweep1", "report-one",
                     {"terms": {"average_final": 1.0, "average_forgetting": 1.0}, "direction": "minimize"}),
        pareto=_sweep(tiny, root / "sweep2", "report-multi",
                      {"metrics": ["average_forgetting", "adaptation_gain"], "directions": ["minimize", "maximize"]}))


@pytest.fixture(scope="module")
def run_report(made):
    html, md = write_report([made.run], made.root / "run-report")
    return SimpleNamespace(html=html.read_text(), md=md.read_text(), folder=html.parent,
                           page=parse(html.read_text()), prefix=f"run-{slug(made.run.name)}",
                           results=RunResults.from_json(made.run / "results.json"))


# --- reading the report back ----------------------------------------------------------------------
class Page(HTMLParser):
    """Section ids, tables by id (header row first) and image sources of an HTML report."""

    def __init__(self):
        super().__init__()
        self.sections, self.tables, self.images, self.links, self.notes = [], {}, [], [], []
        self._table = self._row = self._cell = None
        self._note = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a["id"])
        elif tag == "table":
            self._table = self.tables.setdefault(a["id"], [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "img":
            self.images.append(a["src"])
        elif tag == "p" and a.get("class") == "note":
            self._note = []
        for key in ("src", "href"):
            if key in a:
                self.links.append(a[key])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "p" and self._note is not None:
            self.notes.append("".join(self._note))
            self._note = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._note is not None:
            self._note.append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


def md_table(md: str, caption: str) -> list[list[str]]:
    """The Markdown table under `*caption*` (header row first, the |---| line dropped)."""
    lines = md.split(f"*{caption}*\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines if not line.startswith("|---")]


def run_section_ids(prefix: str, *parts: str) -> set[str]:
    return {prefix, *(f"{prefix}-{p}" for p in parts)}


# --- one run ----------------------------------------------------------------------------------
def test_a_run_report_has_the_sections_its_data_supports(made, run_report):
    expected = run_section_ids(run_report.prefix, "config", "matrix", "metrics", "curves", "strategy", "memory",
                               "tensorboard")
    assert set(run_report.page.sections) == expected  # no comparison, sweep or overlay section
    tables = run_report.page.tables
    # Slot ownership from strategy.json, and one addressing-health table per FwPKM layer.
    assert f"{run_report.prefix}-owned-slots" in tables
    layer_rows = tables[f"{run_report.prefix}-memory-fwpkm1"]
    assert layer_rows[0] == ["experience", "coverage", "collision rate", "KL to uniform"]
    assert len(layer_rows) == 1 + len(run_report.results.matrix.experiences)
    assert all(0 < float(row[1]) <= 1 for row in layer_rows[1:])
    # TensorBoard on the folder of run folders, where it names this run by its folder.
    folder = made.run.resolve()
    assert f"tensorboard --logdir {shown_path(folder.parent)}<" in run_report.html
    assert f"the name {folder.name}/tensorboard" in run_report.html


def test_owned_slots_equal_strategy_json(made, run_report):
    owned = json.loads((made.run / "strategy.json").read_text())["owned_slots"]
    rows = run_report.page.tables[f"{run_report.prefix}-owned-slots"]
    domains = rows[0][1:]
    assert {row[0]: dict(zip(domains, map(int, row[1:]))) for row in rows[1:]} == owned


def test_every_number_of_the_results_tables_equals_results_json(run_report):
    matrix = run_report.results.matrix
    for suffix, value, digits, caption in (("loss", lambda v: v, 4, "loss (nats per token)"),
                                           ("ppl", perplexity, 2, "perplexity")):
        html_rows = run_report.page.tables[f"{run_report.prefix}-{suffix}"]
        md_rows = md_table(run_report.md, caption)
        assert html_rows[0] == md_rows[0] == ["after experience", *matrix.domains]
        assert len(html_rows) == len(md_rows) == matrix.num_experiences + 2
        for t in range(matrix.num_experiences + 1):
            expected = [f"{value(v):.{digits}f}" for v in matrix.values[t]]
            assert html_rows[t + 1][1:] == md_rows[t + 1][1:] == expected


def test_derived_metrics_equal_analysis_summary(run_report):
    rows = dict(run_report.page.tables[f"{run_report.prefix}-summary"][1:])
    for name, value in summary(run_report.results).items():
        if isinstance(value, float):
            # NaN (retention 2 experiences later on this 2-domain stream) reads as what it needs.
            assert rows[name] == (METRICS[name].undefined_text if math.isnan(value) else f"{value:.4f}")
    assert rows["retention_after_2"] == "n/a (needs ≥ 3 experiences and a gain to retain)"


def test_the_report_matches_what_tensorboard_shows(made, run_report):
    """The final row in the report equals TensorBoard's `results/<domain>/loss` at the last row step
    (the matrix), and the curve table's last row its `eval/<domain>/loss` there (the curve: the first
    cl.curve_segments segments, a different number from the matrix's whole split)."""
    acc = EventAccumulator(str(made.run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    results = run_report.results
    last = results.row_steps[str(results.matrix.num_experiences)]
    final_row = run_report.page.tables[f"{run_report.prefix}-loss"][-1]
    curve_row = run_report.page.tables[f"{run_report.prefix}-curve-rows"][-1]
    assert curve_row[1] == str(last)
    for j, domain in enumerate(results.matrix.domains):
        matrix_tb = [e.value for e in acc.Scalars(f"results/{domain}/loss") if e.step == last][-1]
        curve_tb = [e.value for e in acc.Scalars(f"eval/{domain}/loss") if e.step == last][-1]
        # TensorBoard stores float32: equal at the printed precision (half a unit of the 4th decimal).
        assert abs(float(final_row[1 + j]) - matrix_tb) <= 0.5e-4 + 1e-6
        assert abs(float(curve_row[2 + j]) - curve_tb) <= 0.5e-4 + 1e-6
    # Memory statistics exist only in TensorBoard: each experience's row is the last value logged in it.
    memory = run_report.page.tables[f"{run_report.prefix}-memory-fwpkm1"]
    coverage = acc.Scalars("fwpkm/fwpkm1/coverage")
    for t in range(1, results.matrix.num_experiences + 1):
        start, end = results.row_steps[str(t - 1)], results.row_steps[str(t)]
        assert memory[t][1] == f"{[e.value for e in coverage if start < e.step <= end][-1]:.4f}"


def test_images_decode_and_nothing_external_is_referenced(run_report):
    page = run_report.page
    assert len(page.images) == 3  # matrix, curves, memory
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as image:
            assert image.size[0] > 100 and image.size[1] > 100
    assert "http://" not in run_report.html and "https://" not in run_report.html
    assert "<script" not in run_report.html and "<link" not in run_report.html
    assert all(link.startswith(("data:", "#")) for link in page.links)
    # The Markdown twin references its PNG files relatively, and they are there.
    names = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", run_report.md)
    assert len(names) == 3 and all("/" not in n and (run_report.folder / n).is_file() for n in names)


# --- several runs -------------------------------------------------------------------------------
def test_runs_with_different_domains_are_aligned_on_the_shared_ones(made, tmp_path):
    html, _ = write_report([made.run, made.web], tmp_path / "two")
    page = parse(html.read_text())
    web = f"run-{slug(made.web.name)}"
    assert "overlay" in page.sections
    assert run_section_ids(web, "config", "matrix", "metrics", "curves", "strategy", "tensorboard") <= set(page.sections)
    assert f"{web}-memory" not in page.sections  # no FwPKM layer in that run
    assert any("different domain sets" in note and "the domains they share: math;" in note
               for note in page.notes), page.notes
    # Same domain sets: an overlay without a note.
    same = parse(write_report([made.run, made.naive], tmp_path / "same")[0].read_text())
    assert "overlay" in same.sections and not same.notes


def test_runs_that_share_no_domain_are_refused(made, tmp_path):
    other = tmp_path / "renamed"
    shutil.copytree(made.web, other, ignore=shutil.ignore_patterns("checkpoints", "tensorboard"))
    data = json.loads((other / "results.json").read_text())
    # The same real run with its domains renamed, so that none is shared with the tiny stream's.
    rename = {"math": "algebra", "web": "news"}
    for matrix in ("matrix", "memory_reset"):
        data[matrix]["domains"] = [rename[d] for d in data[matrix]["domains"]]
        data[matrix]["experiences"] = [rename[d] for d in data[matrix]["experiences"]]
    data["curves"] = {rename[d]: p for d, p in data["curves"].items()}
    (other / "results.json").write_text(json.dumps(data))
    with pytest.raises(ReportInputError, match="share no domain"):
        write_report([made.run, other], tmp_path / "none")
    assert not (tmp_path / "none").exists()


# --- comparison ---------------------------------------------------------------------------------
def test_a_comparison_report_has_the_table_curves_and_scatter(made, tmp_path):
    from analysis.report_comparison import pareto_front

    html, md = write_report([made.comparison], tmp_path / "cmp")
    page = parse(html.read_text())
    assert page.sections == ["comparison"]
    saved = json.loads((made.comparison / "comparison.json").read_text())["entries"]
    rows = page.tables["comparison-table"]
    head = rows[0]
    assert [r[0] for r in rows[1:]] == list(saved)
    columns = {"adaptation gain": "adaptation_gain", "retention after 2": "retention_after_2",
               "average forgetting": "average_forgetting", "held-out change": "held_out_change",
               "final average loss": "average_final"}
    for row in rows[1:]:
        for label, key in columns.items():
            if math.isnan(saved[row[0]][key]["mean"]):  # retention 2 experiences later, 2 experiences here
                assert row[head.index(label)] == METRICS[key].undefined_text
                continue
            cells = row[head.index(label)].split(" ± ")
            for cell, stat in zip(cells, ("mean", "std")):
                assert float(cell) == pytest.approx(saved[row[0]][key][stat], abs=0.5e-4)
    assert not math.isnan(saved["naive"]["adaptation_gain"]["std"])  # 2 seeds: a real std was compared
    # Against the first entry: the paired differences and fractions comparison.json holds, with
    # their t-interval over the 2 pairs (2 seeds of one base).
    paired = page.tables["comparison-paired"]
    assert [r[0] for r in paired[1:]] == list(saved)[1:]
    for row in paired[1:]:
        d = saved[row[0]]["vs_first"]["average_forgetting"]
        mean, low, high = (float(v) for v in row[paired[0].index("Δ average forgetting")].replace("[", "").replace(
            "]", "").replace(",", "").split())
        assert (mean, low, high) == pytest.approx((d["mean"], *d["t95"]), abs=0.5e-3)
        cut = saved[row[0]]["relative"]["forgetting_cut"]
        assert row[paired[0].index("forgetting cut")] == \
            f"{100 * cut['mean']:.1f} % [{100 * cut['t95'][0]:.1f}, {100 * cut['t95'][1]:.1f}]"
    assert "t-interval over the 2 pairs" in html.read_text()
    # Curves (mean over seeds per entry) and the forgetting-vs-gain scatter; no held-out scatter, as
    # every domain of this stream is trained (test_held_out_scatter below has one).
    assert math.isnan(saved["naive"]["held_out_change"]["mean"])
    assert len(page.images) == 2
    assert "comparison-curves.png" in md.read_text() and (tmp_path / "cmp" / "comparison-scatter.png").is_file()
    # The Pareto front named under the scatter is the one the table's means give.

    means = [(e, saved[e]["adaptation_gain"]["mean"], saved[e]["average_forgetting"]["mean"]) for e in saved]
    front = pareto_front(means)
    assert front and f"Pareto front (no other entry" in html.read_text()
    assert f"one of them strictly; on the means): {', '.join(front)}." in html.read_text()


def test_the_pareto_front_keeps_exactly_the_entries_no_other_beats_on_gain_and_forgetting():
    from analysis.report_comparison import pareto_front

    nan = float("nan")
    points = [("naive", 0.60, 0.40), ("replay", 0.55, 0.12), ("both", 0.50, 0.10), ("worse", 0.50, 0.30),
              ("tie", 0.55, 0.12), ("no gain", nan, 0.0)]
    # worse: both beats it (same gain, less forgetting); equal points do not dominate each other.
    assert pareto_front(points) == ["both", "replay", "tie", "naive"]
    assert pareto_front([("a", 0.1, 0.2)]) == ["a"] and pareto_front([("x", nan, nan)]) == []
    assert pareto_front([("a", 0.2, 0.1), ("b", 0.3, 0.05)]) == ["b"]  # b: more gain and less forgetting


# --- sweeps -----------------------------------------------------------------------------------------
def test_a_sweep_report_shows_trials_history_importances_and_best_yaml(made, tmp_path):
    html, _ = write_report([made.sweep], tmp_path / "sweep")
    text = html.read_text()
    page = parse(text)
    assert page.sections == ["sweep"]
    trials = list(csv.DictReader((made.sweep / "trials.csv").open()))
    rows = page.tables["sweep-trials"]
    assert rows[0][:3] == ["trial", "state", "value"] and "cl.fwpkm.lr_values" in rows[0]
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [(t["number"], t["state"], f"{float(t['value']):.4f}")
                                                      for t in trials]
    assert len(page.images) == 2  # history and importances, as clp sweep drew them
    best = (made.sweep / "best.yaml").read_text()
    assert best.splitlines()[0].replace("'", "&#x27;") in text
    # Without the sweep's plots/ (a sweep folder copied without them) both are drawn from the data.
    bare = tmp_path / "bare"
    shutil.copytree(made.sweep, bare, ignore=shutil.ignore_patterns("plots", "trials", "tensorboard"))
    assert len(parse(write_report([bare], tmp_path / "bare-report")[0].read_text()).images) == 2


def test_a_multi_objective_sweep_report_shows_the_pareto_front(made, tmp_path):
    page = parse(write_report([made.pareto], tmp_path / "pareto")[0].read_text())
    front = json.loads((made.pareto / "pareto.json").read_text())["front"]
    rows = page.tables["sweep-pareto-front"]
    assert rows[0][:3] == ["trial", "average_forgetting", "adaptation_gain"]
    assert [r[0] for r in rows[1:]] == [str(e["trial"]) for e in front]
    assert rows[1][1] == f"{front[0]['values']['average_forgetting']:.4f}"


# --- bad input --------------------------------------------------------------------------------------
def _copy_run(made, tmp_path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(made.run, folder, ignore=shutil.ignore_patterns("checkpoints", "tensorboard", "report"))
    return folder


def _edit_results(folder: Path, change) -> Path:
    data = json.loads((folder / "results.json").read_text())
    change(data)
    (folder / "results.json").write_text(json.dumps(data))
    return folder


BAD = {
    "not a folder of any kind": (lambda f: [p.unlink() for p in f.iterdir()], "not a run folder.*comparison.json"),
    "killed before its first row": (lambda f: (f / "results.json").unlink(), "without results.json.*first results row"),
    "no complete row": (lambda f: _edit_results(f, lambda d: d["matrix"].update(
        values=[[None] * len(row) for row in d["matrix"]["values"]])), "no complete results row"),
    "older schema, no version": (lambda f: _edit_results(f, lambda d: d.pop("schema_version")),
                                 "older or unknown results schema.*no schema_version"),
    "other schema version": (lambda f: _edit_results(f, lambda d: d.update(schema_version=0)),
                             "older or unknown results schema.*schema_version 0"),
    "missing required key": (lambda f: _edit_results(f, lambda d: d.pop("matrix")), "missing field 'matrix'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_by_name_and_leaves_no_report(made, tmp_path, case):
    spoil, message = BAD[case]
    folder = _copy_run(made, tmp_path)
    spoil(folder)
    with pytest.raises(ReportInputError, match=message) as err:
        write_report([folder])  # default output: <folder>/report
    assert str(folder) in str(err.value)
    assert not (folder / "report").exists()
    # A good folder first and the bad one second: still nothing written.
    with pytest.raises(ReportInputError):
        write_report([made.run, folder], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_missing_path_is_refused(tmp_path):
    with pytest.raises(ReportInputError, match=f"{tmp_path / 'nope'}: does not exist"):
        write_report([tmp_path / "nope"])


# --- the command, and no torch --------------------------------------------------------------------
def test_clp_report_writes_beside_the_first_path_and_fails_with_exit_2(made, tiny, tmp_path):
    folder = _copy_run(made, tmp_path)
    proc = tiny.run_cli(["report", str(folder)])
    assert f"report: {folder / 'report' / 'report.html'}" in proc.stdout
    assert (folder / "report" / "report.md").is_file()
    bad = tiny.run_cli(["report", str(tmp_path / "nope")], check=False)
    assert bad.returncode == 2 and f"clp report: error: {tmp_path / 'nope'}: does not exist" in bad.stderr


def test_reports_are_made_without_the_torch_stack(made, tmp_path):
    # A bare sweep copy makes the report compute importances (optuna) too.
    bare = tmp_path / "bare"
    shutil.copytree(made.sweep, bare, ignore=shutil.ignore_patterns("plots", "trials", "tensorboard"))
    code = (
        "import sys\n"
        "BLOCKED = {'torch', 'lightning', 'pytorch_lightning', 'lightning_fabric', 'avalanche', 'torchvision'}\n"
        "class Block:  # any import of the torch stack raises ImportError, as where it is not installed\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from analysis.report import write_report\n"
        "for i, path in enumerate(sys.argv[2:]):\n"
        "    write_report([path], f'{sys.argv[1]}/{i}')\n"
        "print(sorted(m for m in sys.modules if m.startswith('cl_platform.') and m != 'cl_platform.results'\n"
        "             and m != 'cl_platform.atomic'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out"), str(made.run), str(made.comparison),
                          str(bare)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"  # no model code either
    assert len(list((tmp_path / "out").glob("*/report.html"))) == 3


def test_a_comparison_cell_says_n_a_with_its_reason_instead_of_nan():
    from analysis.report_comparison import mean_std

    assert mean_std({"mean": 0.0123, "std": math.nan}, sign=True) == "+0.0123 ± n/a (1 seed)"
    assert mean_std({"mean": 0.0123, "std": 0.004}) == "0.0123 ± 0.0040"
    why = METRICS["retention_after_2"].undefined_text
    assert mean_std({"mean": math.nan, "std": math.nan}, undefined=why) == "n/a (needs ≥ 3 experiences and a gain to retain)"


def test_held_out_scatter_names_the_front_of_more_gain_and_less_damage_to_held_out_text():
    from analysis.report_comparison import held_out_blocks
    from analysis.report_document import Image, Paragraph

    def row(gain: float, held: float) -> dict:
        return {"adaptation_gain": {"mean": gain, "std": 0.1}, "held_out_change": {"mean": held, "std": 0.05}}

    # b has more gain than a and damages held-out text less: a is dominated; c gains most but
    # damages most, so it stays on the front; d has no held-out number (left out of the front).
    entries = {"a": row(0.5, -0.2), "b": row(0.6, -0.1), "c": row(0.9, -0.4), "d": row(0.7, math.nan)}
    blocks = held_out_blocks(entries, METRICS["adaptation_gain"])
    assert [type(b) for b in blocks] == [Paragraph, Image]
    assert "Pareto front: b, c." in blocks[0].text
    assert blocks[1].png.startswith(b"\x89PNG") and blocks[1].name == "comparison-held-out.png"
    # No entry with a held-out domain: no scatter at all.
    assert held_out_blocks({"a": row(0.5, math.nan)}, METRICS["adaptation_gain"]) == []
