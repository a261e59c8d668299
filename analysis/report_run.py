"""The report's sections for one run folder, each present only when the folder has its data:

    config       what ran: stream and order, mode, strategy and its arguments, write rule, seed, base
    matrix       the results matrix as the heatmap TensorBoard shows, and as loss / perplexity tables
    metrics      `analysis.metrics.summary` and the per-experience adaptation gain, plasticity, retention
    curves       forgetting curves per domain, experience ends marked (results.json `row_steps`)
    strategy     strategy.json: what the strategy did, as of its last experience
    memory       per FwPKM layer: slot coverage, collision rate, KL to uniform per experience
                 (TensorBoard `fwpkm/<layer>/...`), and the slots each domain owns (strategy.json)
    slots, gate  what the slots hold and when the gate opens, when the run recorded them
                 (`cl.inspect`: analysis/report_inspect.py)
    tensorboard  the command that opens TensorBoard on the run's folder of runs

Every number comes from results.json (or, for memory statistics, which only TensorBoard holds, from
the run's event files): the matrix in TensorBoard (`results/<domain>/loss`) and the curves
(`eval/<domain>/loss`) are the same numbers.
"""

from __future__ import annotations

import json
import math
from typing import Any

from analysis import metrics, report_plots
from analysis.report_document import Code, Image, Paragraph, Section, Table, num, slug
from analysis.report_inputs import RunInput
from analysis.report_inspect import inspect_sections
from cl_platform.results import perplexity

MEMORY_STATS = {"coverage": "coverage", "collision_rate": "collision rate", "kl_uniform": "KL to uniform"}
# Keys of strategy.json summaries that say which domain owns which FwPKM slots.
SLOT_KEYS = {"owned_slots": "frozen slots owned (slot_freezing)",
             "transferred_slots": "slots moved to the slow memory (slot_transfer)"}


def run_sections(run: RunInput) -> list[Section]:
    prefix = f"run-{slug(run.label)}"
    sections = [Section(prefix, f"Run {run.label}", [Paragraph(f"Folder: {run.path}")])]
    parts = [config_section, matrix_section, metrics_section, curves_section, strategy_section,
             memory_section, tensorboard_section]
    for part in parts:
        section = part(run, prefix)
        if section is not None:
            sections.append(section)
        if part is memory_section:
            sections += inspect_sections(run, prefix)
    return sections


def row_labels(run: RunInput) -> list[str]:
    matrix = run.results.matrix
    return ["0 before"] + [f"{t} {d}" for t, d in enumerate(matrix.experiences, start=1)]


def boundaries(run: RunInput) -> list[tuple[int, str]]:
    """(step, label) where each experience ended, from results.json's row steps."""
    matrix = run.results.matrix
    return [(run.results.row_steps[str(t)], f"end {t} {matrix.experiences[t - 1]}")
            for t in range(1, matrix.last_complete_row + 1) if str(t) in run.results.row_steps]


# --- config -----------------------------------------------------------------------------------------
def describe_strategy(strategy: Any) -> str:
    """`name(arg=value, ...)`, members of a composed list joined with ' + '."""
    if isinstance(strategy, list):
        return " + ".join(describe_strategy(s) for s in strategy)
    if not isinstance(strategy, dict):
        return str(strategy)
    kwargs = strategy.get("kwargs") or {}
    args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return f"{strategy.get('name')}({args})"


def shown_path(path: Any) -> str:
    """A path as the report shows it: relative to the working directory when under it (a report is
    shared: the machine's absolute paths are noise to its reader)."""
    from pathlib import Path

    try:
        return str(Path(str(path)).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _fields(mapping: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) if isinstance(mapping, dict) else str(mapping)


def config_section(run: RunInput, prefix: str) -> Section:
    cfg, res = run.config, run.results
    cl = cfg.get("cl", {}) if isinstance(cfg.get("cl"), dict) else {}
    model = cfg.get("model", {}) if isinstance(cfg.get("model"), dict) else {}
    rows = [["config hash", res.config_hash[:12]]]
    if cfg:
        rows += [["stream", shown_path(cfg.get("stream"))],
                 ["order", " → ".join(map(str, cfg.get("order") or res.matrix.experiences))]]
    else:
        rows.append(["order", " → ".join(res.matrix.experiences)])
    rows += [["mode", res.mode], ["eval memory", res.memory_policy]]
    if cl:
        rows.append(["eval split", str(cl.get("eval_split"))])
    rows.append(["strategy", describe_strategy(cfg["strategy"]) if "strategy" in cfg else res.strategy])
    if cl.get("fwpkm"):
        rows.append(["write rule (cl.fwpkm)", _fields(cl["fwpkm"])])
    for layer, rule in (cl.get("fwpkm_by_layer") or {}).items():
        rows.append([f"write rule, {layer}", _fields(rule)])
    if res.mode == "finetune" and cl:
        rows.append(["finetune", f"lr={cl.get('lr')}, weight_decay={cl.get('weight_decay')}, "
                                 f"grad_clip={cl.get('grad_clip')}"])
    rows.append(["seed", str(res.seed)])
    base = run.record.get("base")
    if isinstance(base, dict):
        rows.append(["base", f"{base.get('path')} ({base.get('how')}, key {str(base.get('key'))[:12]})"])
    elif cfg.get("base_checkpoint"):
        rows.append(["base", str(cfg["base_checkpoint"])])
    if model:
        rows.append(["model", f"{model.get('preset')}: {model.get('n_layer')} layers × d {model.get('d_model')}, "
                              f"FwPKM layers {model.get('fwpkm_layers')}, PKM layers {model.get('pkm_layers')}"])
    if run.record.get("created"):
        rows.append(["created", str(run.record["created"])])
    blocks: list = [Table(f"{prefix}-config-table", ["setting", "value"], rows)]
    if not cfg:
        blocks.insert(0, Paragraph("This folder has no config.yaml: only what results.json records is shown.",
                                   note=True))
    return Section(f"{prefix}-config", "Configuration", blocks, level=3)


# --- results matrix -------------------------------------------------------------------------------
def matrix_section(run: RunInput, prefix: str) -> Section:
    matrix = run.results.matrix
    labels = row_labels(run)
    loss_rows = [[labels[t], *[num(v) for v in matrix.values[t]]] for t in range(len(labels))]
    ppl_rows = [[labels[t], *[num(perplexity(v) if not math.isnan(v) else v, 2) for v in matrix.values[t]]]
                for t in range(len(labels))]
    blocks = [
        Paragraph(f"R[t, j]: {matrix.metric} on each domain's evaluation split (columns) before the stream "
                  "(row 0) and after each experience (rows); '–': not measured (the run stopped)."),
        Image(f"{prefix}-matrix.png", report_plots.matrix_png(matrix), f"results matrix of {run.label}"),
        Table(f"{prefix}-loss", ["after experience", *matrix.domains], loss_rows, f"{matrix.metric} (nats per token)"),
        Table(f"{prefix}-ppl", ["after experience", *matrix.domains], ppl_rows, "perplexity"),
    ]
    if not matrix.is_complete:
        blocks.insert(0, Paragraph(f"Incomplete run: {matrix.last_complete_row} of {matrix.num_experiences} "
                                   "experiences measured.", note=True))
    return Section(f"{prefix}-matrix", "Results matrix", blocks, level=3)


# --- derived metrics ------------------------------------------------------------------------------
def metrics_section(run: RunInput, prefix: str) -> Section:
    summary = metrics.summary(run.results)

    def shown(name: str, value: Any) -> str:
        if name in metrics.METRICS and isinstance(value, float) and math.isnan(value):
            return metrics.METRICS[name].undefined_text  # e.g. retention 2 experiences later on 2 domains
        return num(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)

    rows = [[name, shown(name, value)] for name, value in summary.items()]
    matrix = run.results.matrix
    gains = metrics.adaptation_gain_per_experience(matrix)
    plasticity = metrics.plasticity_per_experience(matrix)
    retention = metrics.retention(matrix)
    later = max((len(v) for v in retention.values()), default=0)
    per_exp = [[f"{t} {matrix.experiences[t - 1]}", num(g, sign=True), num(p, sign=True),
                *[num(retention[t][k]) if t in retention and k < len(retention[t]) else "–" for k in range(later)]]
               for t, (g, p) in enumerate(zip(gains, plasticity), start=1)]
    blocks = [
        Paragraph("analysis.metrics.summary (loss: positive gain / plasticity = better; positive forgetting = "
                  "worse than the best row since the domain was trained)."),
        Table(f"{prefix}-summary", ["metric", "value"], rows),
        Table(f"{prefix}-per-experience",
              ["experience", "adaptation gain", "plasticity", *[f"retained {k + 1} later" for k in range(later)]],
              per_exp, "per experience: gain on its own domain against row 0, against the previous row, and the "
                       "fraction of the gain left k experiences later"),
    ]
    return Section(f"{prefix}-metrics", "Derived metrics", blocks, level=3)


# --- forgetting curves ----------------------------------------------------------------------------
def point_at(points: list[tuple[int, float]], step: int) -> float:
    """The curve's value at `step` (the last point logged there: what TensorBoard plots); NaN if none."""
    values = [v for s, v in points if s == step]
    return values[-1] if values else math.nan


def curves_section(run: RunInput, prefix: str) -> Section | None:
    curves = run.results.curves
    if not any(curves.values()):
        return None
    figure = report_plots.curves_png({d: {run.label: p} for d, p in curves.items()}, boundaries(run),
                                     run.results.matrix.metric)
    blocks: list = [
        Paragraph("Each domain's loss on its first evaluation segments (cl.curve_segments) along the run; dashed "
                  "lines: where each experience ended. TensorBoard: eval/<domain>/loss."),
        Image(f"{prefix}-curves.png", figure, f"forgetting curves of {run.label}"),
    ]
    steps = [(0, "0 before"), *[(s, label.removeprefix("end ")) for s, label in boundaries(run)]]
    if run.results.row_steps:
        domains = list(curves)
        rows = [[label, str(step), *[num(point_at(curves[d], step)) for d in domains]] for step, label in steps]
        blocks.append(Table(f"{prefix}-curve-rows", ["after experience", "step", *domains], rows,
                            "curve value at each experience end"))
    return Section(f"{prefix}-curves", "Forgetting curves", blocks, level=3)


# --- strategy -------------------------------------------------------------------------------------
def strategy_section(run: RunInput, prefix: str) -> Section | None:
    if run.strategy is None:
        return None
    text = json.dumps(run.strategy, indent=1)
    blocks = [Paragraph(f"strategy.json (written after every experience; this one after experience "
                        f"{run.strategy.get('after_experience')})."), Code(text, "json")]
    return Section(f"{prefix}-strategy", "Strategy", blocks, level=3)


# --- memory ---------------------------------------------------------------------------------------
def slot_tables(strategy: dict[str, Any] | None) -> dict[str, dict[str, dict[str, int]]]:
    """{strategy.json key: {layer: {domain: slots}}}, from a single strategy's summary or a composed
    one's members (`SlotFreezing#1`: {...})."""
    if not strategy:
        return {}
    found = {}
    for scope in [strategy, *[v for v in strategy.values() if isinstance(v, dict)]]:
        for key in SLOT_KEYS:
            if isinstance(scope.get(key), dict):
                found[key] = scope[key]
    return found


def memory_per_experience(run: RunInput) -> dict[str, dict[str, list[float]]]:
    """{layer: {stat: value per experience}}: the last value logged during each experience (the read
    counts restart with every experience, so that is the experience's whole addressing health)."""
    if run.tensorboard is None or not run.results.row_steps:
        return {}
    from analysis.tensorboard_scalars import read_scalars

    scalars = read_scalars(run.tensorboard, "fwpkm/")
    out: dict[str, dict[str, list[float]]] = {}
    done = run.results.matrix.last_complete_row
    for tag, points in scalars.items():
        _, layer, stat = tag.split("/", 2)
        if stat not in MEMORY_STATS:
            continue
        values = []
        for t in range(1, done + 1):
            start, end = run.results.row_steps.get(str(t - 1)), run.results.row_steps.get(str(t))
            inside = [v for s, v in points if start is not None and end is not None and start < s <= end]
            values.append(inside[-1] if inside else math.nan)
        out.setdefault(layer, {})[stat] = values
    return out


def memory_section(run: RunInput, prefix: str) -> Section | None:
    stats = memory_per_experience(run)
    slots = slot_tables(run.strategy)
    if not stats and not slots:
        return None
    experiences = run.results.matrix.experiences[:run.results.matrix.last_complete_row]
    blocks: list = []
    if stats:
        blocks.append(Paragraph("Addressing health of each FwPKM layer over the reads of each experience, as last "
                                "logged in it (TensorBoard fwpkm/<layer>/coverage, collision_rate, kl_uniform): "
                                "coverage = share of slots read at least once, collision rate = share of reads "
                                "landing on a slot read more than once, KL(usage ‖ uniform)."))
        series = {label: {layer: stats[layer].get(stat, []) for layer in stats} for stat, label in MEMORY_STATS.items()}
        blocks.append(Image(f"{prefix}-memory.png", report_plots.per_experience_png(series, experiences),
                            f"FwPKM addressing health of {run.label}"))
        for layer, by_stat in stats.items():
            rows = [[f"{t} {d}", *[num(by_stat.get(stat, [])[t - 1] if t <= len(by_stat.get(stat, [])) else None)
                                   for stat in MEMORY_STATS]] for t, d in enumerate(experiences, start=1)]
            blocks.append(Table(f"{prefix}-memory-{slug(layer)}", ["experience", *MEMORY_STATS.values()], rows, layer))
    for key, per_layer in slots.items():
        domains = sorted({d for owned in per_layer.values() for d in owned})
        rows = [[layer, *[str(owned.get(d, 0)) for d in domains]] for layer, owned in per_layer.items()]
        blocks.append(Table(f"{prefix}-{slug(key)}", ["layer", *domains], rows, f"{SLOT_KEYS[key]} (strategy.json)"))
    return Section(f"{prefix}-memory", "Memory (FwPKM slots)", blocks, level=3)


# --- tensorboard ----------------------------------------------------------------------------------
def tensorboard_section(run: RunInput, prefix: str) -> Section | None:
    if run.tensorboard is None:
        return None
    # Pointed at the folder of run folders, TensorBoard names each run by its folder
    # (`<run folder>/tensorboard`); pointed at the run's own tensorboard/ it would call it '.'.
    folder = run.path.resolve()
    blocks = [Paragraph("The same numbers, step by step (results/<domain>/loss: the matrix rows; "
                        "eval/<domain>/loss: the curves; fwpkm/<layer>/...: memory statistics), this run "
                        f"under the name {folder.name}/tensorboard beside the other runs of its folder:"),
              Code(f"tensorboard --logdir {shown_path(folder.parent)}", "bash")]
    return Section(f"{prefix}-tensorboard", "TensorBoard", blocks, level=3)
