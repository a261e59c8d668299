"""The report's section for a `clp sweep` folder:

    trials        trials.csv: state, objective value(s) and parameters of every trial
    history       the objective per trial (plots/history*.png from `clp sweep`, else drawn from trials.csv)
    importances   parameter importances (plots/importances*.png, else fANOVA on study.db when there)
    pareto        several objectives: the front (plots/pareto_front.png, else drawn) and pareto.json
    best          one objective: best.yaml, the runnable config of the best trial

Images `clp sweep` already drew are embedded as they are, so the report shows what the sweep
folder shows; only a missing one is drawn here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from analysis import report_plots
from analysis.report_document import Code, Image, Paragraph, Section, Table, num
from analysis.report_inputs import SweepInput, number


def directions(sweep: SweepInput) -> list[str | None]:
    """One direction per objective column, read from what `clp sweep` wrote (best.yaml's header or
    pareto.json's objective: the sweep's `describe()`); None where it does not say."""
    if sweep.pareto and isinstance(sweep.pareto.get("objective"), str):
        found = dict(re.findall(r"(\w+) (minimize|maximize)", sweep.pareto["objective"]))
        return [found.get(c.removeprefix("value_")) for c in sweep.value_columns]
    header = (sweep.best_yaml or "").splitlines()[:1]
    match = re.search(r"\((minimize|maximize)", header[0]) if header else None
    return [match.group(1) if match else None]


def objective_text(sweep: SweepInput) -> str:
    if sweep.pareto and sweep.pareto.get("objective"):
        return str(sweep.pareto["objective"])
    match = re.search(r"\(((?:minimize|maximize)[^)]*)\)", (sweep.best_yaml or "").split("\n", 1)[0])
    return match.group(1) if match else "not recorded (no best.yaml or pareto.json yet)"


def sweep_sections(sweep: SweepInput) -> list[Section]:
    states: dict[str, int] = {}
    for t in sweep.trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    rows = [[t["number"], t["state"], *[num(number(t.get(c))) for c in sweep.value_columns],
             *[str(t.get(p, "")) for p in sweep.param_columns]] for t in sweep.trials]
    blocks: list = [
        Paragraph(f"Folder: {sweep.path}. Objective: {objective_text(sweep)}, measured on the dev split. Trials: "
                  + ", ".join(f"{n} {s.lower()}" for s, n in states.items()) + "."),
        Table("sweep-trials", ["trial", "state", *sweep.value_columns, *sweep.param_columns], rows, "trials.csv"),
    ]
    blocks += history_blocks(sweep) + importance_blocks(sweep) + pareto_blocks(sweep)
    if "intermediate_values" in sweep.plots:
        blocks.append(_saved(sweep, "intermediate_values", "what the pruner saw: mean curve loss per step"))
    if sweep.best_yaml is not None:
        blocks += [Paragraph("Best configuration (best.yaml: `clp run` on it repeats the best trial on the dev "
                             "split; add cl.eval_split=eval to measure it on the eval split):"),
                   Code(sweep.best_yaml, "yaml")]
    return [Section("sweep", "Sweep", blocks)]


def _saved(sweep: SweepInput, name: str, alt: str) -> Image:
    return Image(f"sweep-{name}.png", Path(sweep.plots[name]).read_bytes(), alt)


def _complete_values(sweep: SweepInput, column: str) -> list[tuple[int, float]]:
    return [(int(t["number"]), number(t.get(column))) for t in sweep.trials
            if t["state"] == "COMPLETE" and not math.isnan(number(t.get(column)))]


def history_blocks(sweep: SweepInput) -> list:
    saved = [name for name in sweep.plots if name == "history" or name.startswith("history_")]
    if saved:
        return [_saved(sweep, name, f"optimization history ({name})") for name in saved]
    out = []
    for column, direction in zip(sweep.value_columns, directions(sweep)):
        values = _complete_values(sweep, column)
        if values:
            out.append(Image(f"sweep-history-{column}.png", report_plots.history_png(values, direction, column),
                             f"optimization history of {column}"))
    return out


def importance_blocks(sweep: SweepInput) -> list:
    saved = [name for name in sweep.plots if name == "importances" or name.startswith("importances_")]
    if saved:
        return [_saved(sweep, name, f"parameter importances ({name})") for name in saved]
    importances = fanova_importances(sweep)
    if not importances:
        return [Paragraph("Parameter importances: not available (they need study.db, two or more complete trials "
                          "and a parameter that varies).")]
    return [Image(f"sweep-importances-{column}.png", report_plots.bars_png(values, f"importance for {column}"),
                  f"parameter importances for {column}") for column, values in importances.items()]


def fanova_importances(sweep: SweepInput) -> dict[str, dict[str, float]]:
    """{objective column: {param: importance}} by fANOVA (seeded, like `clp sweep`'s plots) on the
    study in study.db; {} when there is no database or too little to compute from."""
    db = sweep.path / "study.db"
    if not db.is_file() or sum(t["state"] == "COMPLETE" for t in sweep.trials) < 2:
        return {}
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db.resolve()}"
    names = optuna.study.get_all_study_names(storage)
    if len(names) != 1:
        return {}
    study = optuna.load_study(study_name=names[0], storage=storage)
    out = {}
    for i, column in enumerate(sweep.value_columns):
        try:
            out[column] = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0),
                                                target=(lambda t, i=i: t.values[i]) if len(sweep.value_columns) > 1
                                                else None)
        except (ValueError, RuntimeError):  # e.g. no parameter varies: nothing to attribute
            return {}
    return out


def pareto_blocks(sweep: SweepInput) -> list:
    if len(sweep.value_columns) < 2:
        return []
    out: list = []
    if "pareto_front" in sweep.plots:
        out.append(_saved(sweep, "pareto_front", "Pareto front"))
    elif len(sweep.value_columns) == 2:
        front = {int(e["trial"]) for e in (sweep.pareto or {}).get("front", [])}
        a, b = sweep.value_columns
        points = [(int(t["number"]), number(t.get(a)), number(t.get(b))) for t in sweep.trials if t["state"] == "COMPLETE"]
        out.append(Image("sweep-pareto.png", report_plots.pareto_png(points, front, (a, b)), "Pareto front"))
    if sweep.pareto and sweep.pareto.get("front"):
        metrics = [c.removeprefix("value_") for c in sweep.value_columns]
        rows = [[str(e["trial"]), *[num(e.get("values", {}).get(m)) for m in metrics], " ".join(e.get("overrides", [])),
                 str(e.get("config"))] for e in sweep.pareto["front"]]
        out.append(Table("sweep-pareto-front", ["trial", *metrics, "overrides", "runnable config"], rows,
                         "Pareto front (pareto.json)"))
    return out
