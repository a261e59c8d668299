"""What `clp sweep` writes into `<runs_root>/sweep-<name>/`, rebuilt from the study every time:

    best.yaml       one objective: the run config with the best trial's overrides applied,
                    resolved (`clp run best.yaml` repeats that trial's run on the dev split;
                    `clp run best.yaml cl.eval_split=eval` measures it on the eval split); the
                    header gives the objective value, trial and overrides
    pareto.json     several objectives: the Pareto front (trial, values, params, overrides, run
                    folder, metrics), and pareto/trial-<n>.yaml, one such runnable config per
                    front trial
    trials.csv      every trial: state, objective value(s), params, summary metrics, run folder
    plots/          Optuna's matplotlib plots: optimization history, intermediate values (what
                    the pruner saw), parameter importances (>= 2 complete trials and a parameter
                    that varies), Pareto front (several objectives); a plot that cannot be drawn
                    is named in the output and skipped
    tensorboard/    one hparams run per COMPLETE trial (`tensorboard --logdir <dir>/tensorboard`,
                    HPARAMS tab): its params against objective value(s) and summary metrics
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any, Callable

from cl_platform.atomic import atomic_write_json, atomic_write_text


def write_reports(sweep: Any, study: Any, out: Path, say: Callable[[str], None] = print) -> None:
    from optuna.trial import TrialState

    everything = study.get_trials(deepcopy=False)
    # Surplus trials were never run (experiments/multi/sweep.py: claims_a_place): not in the tables.
    trials = [t for t in everything if not t.user_attrs.get("surplus")]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    states = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    surplus = len(everything) - len(trials)
    say(f"sweep {sweep.name}: " + ", ".join(f"{n} {s.lower()}" for s, n in states.items() if n)
        + (f" ({surplus} surplus trial(s) created by racing workers, not run)" if surplus else ""))
    atomic_write_text(out / "trials.csv", trials_csv(sweep, trials))
    if complete and not sweep.objective.is_multi:
        best = study.best_trial
        atomic_write_text(out / "best.yaml", runnable_yaml(sweep, best))
        say(f"best: trial {best.number}, objective {best.value:.6g} ({' '.join(best.user_attrs['overrides'])})")
        say(f"  {out / 'best.yaml'}: clp run {out / 'best.yaml'}   (add cl.eval_split=eval to measure it on eval)")
    elif complete:
        write_pareto(sweep, study.best_trials, out, say)
    write_plots(sweep, study, out / "plots", say)
    write_hparams(sweep, complete, out / "tensorboard")
    say(f"trials: {out / 'trials.csv'}; plots: {out / 'plots'}/; TensorBoard: tensorboard --logdir {out / 'tensorboard'}")


def runnable_yaml(sweep: Any, trial: Any) -> str:
    """The run config with the trial's overrides (dev split included), resolved, with a header."""
    from cl_platform.config import load_config, to_yaml

    cfg = load_config(sweep.run, trial.user_attrs["overrides"])
    cfg = dataclasses.replace(cfg, name=f"sweep-{sweep.name}-trial{trial.number}")
    values = trial.values if sweep.objective.is_multi else [trial.value]
    header = [
        f"# Trial {trial.number} of sweep '{sweep.name}': objective {', '.join(f'{v:.6g}' for v in values)} "
        f"({sweep.objective.describe()}), on the dev split.",
        f"# = {sweep.run} with {' '.join(trial.user_attrs['overrides'])}",
        f"# Its run: {trial.user_attrs['run_folder']}. `clp run` on this file repeats it; add",
        "# cl.eval_split=eval to measure the chosen settings on the eval split.",
    ]
    return "\n".join(header) + "\n" + to_yaml(cfg)


def write_pareto(sweep: Any, front: list, out: Path, say: Callable[[str], None]) -> None:
    folder = out / "pareto"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    entries = []
    for trial in sorted(front, key=lambda t: t.number):
        atomic_write_text(folder / f"trial-{trial.number}.yaml", runnable_yaml(sweep, trial))
        entries.append({"trial": trial.number, "values": dict(zip(sweep.objective.metrics, trial.values)),
                        "params": trial.params, "overrides": trial.user_attrs["overrides"],
                        "run_folder": trial.user_attrs["run_folder"], "metrics": trial.user_attrs.get("metrics", {}),
                        "config": str(folder / f"trial-{trial.number}.yaml")})
    atomic_write_json(out / "pareto.json", {"objective": sweep.objective.describe(), "front": entries})
    say(f"Pareto front: trials {[e['trial'] for e in entries]} → {out / 'pareto.json'}, {folder}/trial-<n>.yaml")


def trials_csv(sweep: Any, trials: list) -> str:
    from analysis.metrics import METRICS

    objective = sweep.objective
    value_names = [f"value_{m}" for m in objective.metrics] if objective.is_multi else ["value"]
    params = list(sweep.space)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["number", "state", *value_names, *params, *METRICS, "run_folder", "retry_of", "seconds"])
    for t in trials:
        values = list(t.values) if t.values is not None else [None] * len(value_names)
        metrics = t.user_attrs.get("metrics", {})
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        w.writerow([t.number, t.state.name, *values, *[t.params.get(p) for p in params],
                    *[metrics.get(m) for m in METRICS], t.user_attrs.get("run_folder"),
                    t.system_attrs.get("failed_trial"), seconds])
    return buf.getvalue()


def write_plots(sweep: Any, study: Any, folder: Path, say: Callable[[str], None]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on the machines sweeps run on
    import matplotlib.pyplot as plt
    import optuna
    import optuna.visualization.matplotlib as ovm
    from optuna.trial import TrialState

    folder.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    varies = any(len({json.dumps(t.params.get(p)) for t in complete}) > 1 for p in sweep.space)
    plots: dict[str, Callable[[], Any]] = {}
    if sweep.objective.is_multi:
        for i, metric in enumerate(sweep.objective.metrics):
            plots[f"history_{metric}"] = lambda i=i, m=metric: ovm.plot_optimization_history(
                study, target=lambda t: t.values[i], target_name=m)
            if len(complete) >= 2 and varies:
                plots[f"importances_{metric}"] = lambda i=i, m=metric: ovm.plot_param_importances(
                    study, evaluator=importance(), target=lambda t: t.values[i], target_name=m)
            if complete:  # how the metric moves with each parameter, one panel per parameter
                plots[f"slice_{metric}"] = lambda i=i, m=metric: ovm.plot_slice(
                    study, target=lambda t: t.values[i], target_name=m)
        if len(sweep.objective.metrics) <= 3:
            plots["pareto_front"] = lambda: ovm.plot_pareto_front(study, target_names=sweep.objective.metrics)
    else:
        plots["history"] = lambda: ovm.plot_optimization_history(study)
        if sweep.prunes:
            plots["intermediate_values"] = lambda: ovm.plot_intermediate_values(study)
        if len(complete) >= 2 and varies:
            plots["importances"] = lambda: ovm.plot_param_importances(study, evaluator=importance())
        if complete:
            plots["slice"] = lambda: ovm.plot_slice(study)
    import warnings

    for name, draw in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = draw()
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.savefig(folder / f"{name}.png", dpi=100, bbox_inches="tight")
            plt.close(figure)
        except Exception as err:  # a plot is a convenience: say why it is missing, keep the sweep's results
            say(f"plot {name} skipped: {type(err).__name__}: {err}")


def importance() -> Any:
    """fANOVA: variance explained, the same whichever way the objective points (Optuna's default
    evaluator ranks parameters by reaching low values only); seeded, so plots are reproducible."""
    from optuna.importance import FanovaImportanceEvaluator

    return FanovaImportanceEvaluator(seed=0)


def write_hparams(sweep: Any, complete: list, folder: Path) -> None:
    """One TensorBoard hparams run per COMPLETE trial, rewritten from the study each time."""
    from torch.utils.tensorboard import SummaryWriter

    if folder.exists():
        shutil.rmtree(folder)
    objective = sweep.objective
    with SummaryWriter(log_dir=str(folder)) as writer:
        for t in sorted(complete, key=lambda t: t.number):
            params = {p: (v if isinstance(v, (int, float, str, bool)) else str(v)) for p, v in t.params.items()}
            if objective.is_multi:
                metrics = {f"objective/{m}": v for m, v in zip(objective.metrics, t.values)}
            else:
                metrics = {"objective": t.value}
            metrics.update({f"metrics/{k}": v for k, v in t.user_attrs.get("metrics", {}).items()
                            if v is not None and math.isfinite(v)})
            writer.add_hparams(params, metrics, run_name=f"trial-{t.number:04d}")
