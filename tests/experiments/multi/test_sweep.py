"""`clp sweep` on the tiny stream (with a dev split): real SQLite studies, real tiny runs through
`execute`. A sweep completes and reports, continues, prunes, shares its study between worker
processes, retries a killed worker's trial in its run folder, and refuses bad input before any
trial (or pretraining) starts."""
import csv
import json
import os
import time
import uuid

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from analysis.metrics import summary
from cl_platform.check import ConfigError
from cl_platform.config import load_config
from cl_platform.results import RunResults
from experiments.multi import sweep as sw
from experiments.multi import sweep_config as sc
from experiments.run import execute

SPACE = {"cl.fwpkm.lr_values": {"type": "float", "low": 0.03, "high": 3.0, "log": True},
         "cl.fwpkm.chunk": {"type": "categorical", "choices": [8, 16]}}
OBJECTIVE = {"terms": {"average_final": 1.0, "average_forgetting": 1.0}, "direction": "minimize"}


def quiet(_):
    pass


def write(tiny, tmp_path, name, runs=None, run=None, **fields):
    """A run config on the tiny stream with a dev split (same base as `tiny_base`) and a sweep file."""
    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache")}
    spec["token_budget"] = {**spec["token_budget"], "dev": 256}
    stream = tiny.write_yaml(tmp_path / "stream.yaml", spec)
    tiny.config(tmp_path / "run.yaml", stream=str(stream), runs_root=str(runs or tiny.runs), **(run or {}))
    data = {"run": "run.yaml", "name": name, "trials": 3, "sampler": "random", "seed": 0, "space": SPACE,
            "objective": OBJECTIVE, "pruner": {"name": "none"}, **fields}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def study_of(path):
    sweep = sc.load(path)
    return optuna.load_study(study_name=sweep.name, storage=sc.storage_url(sweep))


def objective(results):
    s = summary(results)
    return s["average_final"] + s["average_forgetting"]


@pytest.mark.slow
def test_a_sweep_reuses_one_base_reports_continues_and_its_best_config_reproduces(tiny, tmp_path):
    runs = tmp_path / "runs"  # a fresh runs root: the base is pretrained here, once
    path = write(tiny, tmp_path, "three", runs=runs)
    said = []
    out, study = sw.run(path, say=said.append)
    assert out == runs / "sweep-three"
    trials = study.trials
    assert [(t.number, t.state) for t in trials] == [(n, TrialState.COMPLETE) for n in range(3)]
    assert len(list(runs.glob("pretrain-*"))) == 1
    assert sum("base model: pretraining" in line for line in said) == 1
    assert sum("base model: cached" in line for line in said) == 2
    assert len({t.params["cl.fwpkm.lr_values"] for t in trials}) == 3
    assert study.metric_names == ["1·average_final + 1·average_forgetting"]  # named in Optuna Dashboard

    for t in trials:
        folder = out / "trials" / str(t.number)
        assert t.user_attrs["run_folder"] == str(folder)
        results = RunResults.from_json(folder / "results.json")
        assert results.matrix.is_complete
        cfg = load_config(folder / "config.yaml")
        assert cfg.cl.eval_split == "dev"  # objectives are measured on dev, always
        assert cfg.cl.fwpkm.lr_values == t.params["cl.fwpkm.lr_values"]
        assert cfg.cl.fwpkm.chunk == t.params["cl.fwpkm.chunk"]
        assert t.value == objective(results)
        assert t.user_attrs["metrics"]["average_final"] == summary(results)["average_final"]

    best = min(trials, key=lambda t: t.value)
    text = (out / "best.yaml").read_text()
    assert text.startswith(f"# Trial {best.number} of sweep 'three': objective {best.value:.6g}")
    _, again, _ = execute(out / "best.yaml", progress_bar=False, say=quiet)
    assert objective(again) == pytest.approx(best.value, abs=1e-9)

    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [(r["number"], r["state"]) for r in rows] == [(str(n), "COMPLETE") for n in range(3)]
    assert float(rows[1]["value"]) == pytest.approx(trials[1].value)
    assert float(rows[1]["cl.fwpkm.lr_values"]) == pytest.approx(trials[1].params["cl.fwpkm.lr_values"])
    assert {p.name for p in (out / "plots").iterdir()} == {"history.png", "importances.png", "slice.png"}
    for t in trials:
        acc = EventAccumulator(str(out / "tensorboard" / f"trial-{t.number:04d}"),
                               size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
        assert acc.Scalars("objective")[0].value == pytest.approx(t.value)

    # The same command continues the study; --trials raises the target by exactly one trial.
    said = []
    _, study = sw.run(path, trials=4, say=said.append)
    assert [(t.number, t.state) for t in study.trials] == [(n, TrialState.COMPLETE) for n in range(4)]
    assert [t.params for t in study.trials[:3]] == [t.params for t in trials]
    assert study.trials[3].params not in [t.params for t in trials]  # a continued study draws anew
    assert sum(line.startswith("--- trial") and "objective" not in line for line in said) == 1
    assert len(list(runs.glob("pretrain-*"))) == 1


def test_a_bad_trial_is_pruned_and_its_run_folder_stays(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "prune", space={"cl.fwpkm.lr_values": {"type": "categorical", "choices": [0.03, 30.0]}},
                 pruner={"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0})
    sweep = sc.load(path)
    sc.sweep_dir(sweep).mkdir(parents=True)
    study = sw.create_study(sweep, sw.make_storage(sweep, sc.storage_url(sweep)), 0)
    for lr in (0.03, 30.0, 0.03):  # good, clearly worse (writes 1000x too large), good again
        study.enqueue_trial({"cl.fwpkm.lr_values": lr})
    out, study = sw.run(path, say=quiet)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE]
    assert study.trials[0].value == study.trials[2].value
    pruned = study.trials[1]
    # Reported at the first curve point after training (curve_every 2), keyed by the run's step.
    assert list(study.trials[0].intermediate_values)[:3] == [2, 4, 6]
    assert list(pruned.intermediate_values) == [2]
    # What the median pruner compared: at step 2 the pruned trial's value was above the median of
    # the completed trials' values there (one trial: its own value), so it stopped.
    assert pruned.intermediate_values[2] > study.trials[0].intermediate_values[2]
    folder = out / "trials" / "1"
    assert (folder / "checkpoints" / "last.ckpt").is_file()
    assert not RunResults.from_json(folder / "results.json").matrix.is_complete
    assert (out / "plots" / "intermediate_values.png").is_file()


def test_a_multi_objective_sweep_writes_its_pareto_front(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "multi", trials=2,
                 objective={"metrics": ["average_forgetting", "adaptation_gain"], "directions": ["minimize", "maximize"]})
    out, study = sw.run(path, say=quiet)
    assert study.metric_names == ["average_forgetting", "adaptation_gain"]
    front = json.loads((out / "pareto.json").read_text())["front"]
    assert sorted(e["trial"] for e in front) == sorted(t.number for t in study.best_trials)
    for entry in front:
        trial = study.trials[entry["trial"]]
        assert entry["values"] == {"average_forgetting": trial.values[0], "adaptation_gain": trial.values[1]}
        assert load_config(entry["config"]).cl.fwpkm.lr_values == trial.params["cl.fwpkm.lr_values"]
    assert not (out / "best.yaml").exists()
    assert (out / "plots" / "pareto_front.png").is_file()
    assert (out / "plots" / "slice_average_forgetting.png").is_file() and (out / "plots" / "slice_adaptation_gain.png").is_file()


BAD = [
    ({"space": {"cl.fwpkm.lr_value": {"type": "float", "low": 0.1, "high": 1.0}}}, "space.cl.fwpkm.lr_value"),
    ({"space": {"model.d_model": {"type": "int", "low": 32, "high": 64}}}, "space.model.d_model.*base model"),
    ({"space": {"cl.eval_split": {"type": "categorical", "choices": ["eval"]}}}, "space.cl.eval_split.*always dev"),
    ({"space": {"cl.fwpkm.chunk": {"type": "categorical", "choices": []}}}, "space.cl.fwpkm.chunk.choices"),
    ({"space": {"cl.fwpkm.lr_values": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}},
     "space.cl.fwpkm.lr_values.low.*log"),
    ({"space": {"cl.fwpkm.lr_values": {"type": "float", "low": 1.0, "high": 1.0}}}, "space.cl.fwpkm.lr_values.high"),
    ({"space": {"cl.fwpkm.chunk": {"type": "float", "low": 8.5, "high": 16.0}}}, "space.cl.fwpkm.chunk"),
    ({"space": {"strategy.kwargs.fraction": {"type": "float", "low": 0.1, "high": 1.5}}},
     "space.strategy.kwargs.fraction.*1.5"),
    ({"objective": {"terms": {"average_finale": 1.0}}}, "objective.terms.*average_finale"),
    ({"objective": {"metrics": ["average_forgetting", "adaptation_gain"], "directions": ["minimize", "maximize"]},
      "pruner": {"name": "median"}}, "pruner.*multi-objective studies cannot prune"),
    ({"storage": "sqlite:////nonexistent-clp-folder/study.db"}, "storage.*does not exist"),
    ({"storage": "postgresql+nosuchdriver://u@127.0.0.1:1/db"}, "'storage': cannot use database"),
    ({"trials": 0}, "trials"),
    ({"sampler": "grid"}, "sampler"),
    ({"overrides": ["pretrain.steps=10"]}, r"overrides\[0\].*base model"),
    ({"overrides": ["cl.mode=fast", "cl.batch_size=0"]}, r"overrides\[1\].*batch_size"),
    ({"overrides": ["cl.nonsense=1"]}, r"overrides\[0\].*cl.nonsense"),
    ({"overrides": "cl.mode=finetune"}, "overrides.*list of dotted overrides"),
]


@pytest.mark.parametrize("fields, message", BAD, ids=[m.split(".*")[0] for _, m in BAD])
def test_bad_input_is_refused_naming_the_field_before_any_trial(tiny, tmp_path, fields, message):
    runs = tmp_path / "runs"  # nothing may appear here: no sweep folder, no pretraining
    path = write(tiny, tmp_path, "bad", runs=runs, run={"strategy": {"name": "slot_freezing"}}, **fields)
    with pytest.raises(ConfigError, match=message):
        sw.run(path, say=quiet)
    assert not runs.exists()


def test_a_study_of_the_same_name_with_another_space_is_refused(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "samename")
    sweep = sc.load(path)
    sc.sweep_dir(sweep).mkdir(parents=True)
    sw.create_study(sweep, sw.make_storage(sweep, sc.storage_url(sweep)), 0)
    other = write(tiny, tmp_path, "samename", space={"cl.fwpkm.chunk": {"type": "categorical", "choices": [8, 16, 32]}})
    with pytest.raises(ConfigError, match="field 'space': study 'samename'.*different space"):
        sw.run(other, say=quiet)
    assert study_of(path).trials == []


def test_fixed_overrides_come_before_every_trials_values_and_are_part_of_the_study(tiny, tiny_base, tmp_path):
    # A sweep of one comparison entry's setting: every trial runs slot freezing, only its fraction is sampled.
    space = {"strategy.kwargs.fraction": {"type": "categorical", "choices": [0.1, 0.3]}}
    path = write(tiny, tmp_path, "fixed", trials=2, space=space, overrides=["strategy.name=slot_freezing"])
    out, study = sw.run(path, say=quiet)
    for t in study.trials:
        assert t.user_attrs["overrides"] == ["strategy.name=slot_freezing",
                                             f"strategy.kwargs.fraction={t.params['strategy.kwargs.fraction']}",
                                             "cl.eval_split=dev"]
        cfg = yaml.safe_load((out / "trials" / str(t.number) / "config.yaml").read_text())
        assert cfg["strategy"] == {"name": "slot_freezing", "kwargs": {"fraction": t.params["strategy.kwargs.fraction"]}}
    other = write(tiny, tmp_path, "fixed", trials=2, space=space, overrides=["strategy.name=slot_transfer"])
    with pytest.raises(ConfigError, match="field 'overrides': study 'fixed'.*different overrides"):
        sw.run(other, say=quiet)


@pytest.mark.parametrize("value", [0.03, 1e-05, 3, True, "balanced", "1", None, 2.5e+20])
def test_values_are_written_so_the_config_loader_reads_them_back(value):
    text = sc.format_value(value)
    assert yaml.safe_load(text) == value and type(yaml.safe_load(text)) is type(value)


SLOW_PARENT = """
import sys, time
import experiments.run as run
from cl_platform.callbacks import RunCallback

class Slow(RunCallback):  # this process's trials take seconds, so that the worker it starts joins in
    def on_curve_point(self, runner, step):
        time.sleep(0.5)

real = run.execute
run.execute = lambda *a, callbacks=None, **k: real(*a, callbacks=[*(callbacks or []), Slow()], **k)
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_two_workers_share_one_study_without_lost_or_duplicated_trials(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "workers", trials=6)
    proc = tiny.run_cli(["sweep", str(path), "--workers", "2"], script=SLOW_PARENT)
    study = study_of(path)
    # Trials the two workers asked for at the same moment past the target are surplus: refused
    # before any run (tests/experiments/multi/test_sweep_claims.py), not in trials.csv.
    ran = [t for t in study.trials if not t.user_attrs.get("surplus")]
    assert len(ran) == 6 and all(t.state == TrialState.COMPLETE for t in ran)
    assert all(t.state == TrialState.FAIL and not t.params for t in study.trials if t not in ran)
    folders = [t.user_attrs["run_folder"] for t in ran]
    assert len(set(folders)) == 6
    out = sc.sweep_dir(sc.load(path))
    assert not (out / "study.lock").exists()  # the storage coordinates the workers, not a file
    with open(out / "trials.csv") as f:
        assert [int(row["number"]) for row in csv.DictReader(f)] == [t.number for t in ran]
    log = (out / "workers" / "worker-1.log").read_text()
    mine = proc.stdout.count("--- trial") - proc.stdout.count(": objective")
    theirs = log.count("--- trial") - log.count(": objective")
    assert mine + theirs == 6 and mine >= 1 and theirs >= 1, (proc.stdout[-2000:], log[-2000:])
    assert (out / "best.yaml").is_file() and "best: trial" in proc.stdout and "best: trial" not in log


# The worker gets SIGNAL at run step 4 of trial 0: SIGKILL (it dies, no clean-up) or SIGTERM (a
# scheduler stops it).
SIGNAL_AT_STEP_4 = """
import os, signal, sys
import experiments.run as run
from cl_platform.callbacks import RunCallback

class SignalAt(RunCallback):
    def on_curve_point(self, runner, step):
        if step == 4 and runner.run_dir.name == "0":
            os.kill(os.getpid(), signal.SIGNAL)

real = run.execute
run.execute = lambda *a, callbacks=None, **k: real(*a, callbacks=[*(callbacks or []), SignalAt()], **k)
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""
KILLER = SIGNAL_AT_STEP_4.replace("SIGNAL", "SIGKILL")
TERMINATED = SIGNAL_AT_STEP_4.replace("SIGNAL", "SIGTERM")


@pytest.mark.slow
def test_a_killed_workers_trial_is_retried_in_its_run_folder(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "killed", trials=2, heartbeat_interval=1, grace_period=2)
    killed = tiny.run_cli(["sweep", str(path)], script=KILLER, check=False)
    assert killed.returncode == -9
    assert study_of(path).trials[0].state == TrialState.RUNNING
    time.sleep(3)  # the grace period passes without a heartbeat
    again = tiny.run_cli(["sweep", str(path)])
    study = study_of(path)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = study.trials[1]
    assert retry.system_attrs["failed_trial"] == 0 and retry.params == study.trials[0].params
    folder = sc.sweep_dir(sc.load(path)) / "trials" / "0"
    assert retry.user_attrs["run_folder"] == str(folder)
    assert "resuming" in again.stdout
    assert len(json.loads((folder / "run.json").read_text())["resumes"]) == 1
    # The resumed run equals one made without the kill.
    fresh = tmp_path / "fresh"
    _, results, _ = execute(sc.load(path).run, retry.user_attrs["overrides"], run_dir=fresh, progress_bar=False, say=quiet)
    assert results.matrix == RunResults.from_json(folder / "results.json").matrix
    assert retry.value == objective(results)


@pytest.mark.slow
def test_a_preempted_worker_queues_its_trial_which_continues_from_the_sigterm_step(tiny, tiny_base, tmp_path):
    path = write(tiny, tmp_path, "preempted", trials=2)
    stopped = tiny.run_cli(["sweep", str(path)], script=TERMINATED, check=False)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "stopped by SIGTERM during trial 0" in stopped.stderr.strip().splitlines()[-1]
    study = study_of(path)
    # No waiting for a grace period: the trial is failed and queued again at once.
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]
    again = tiny.run_cli(["sweep", str(path)])
    study = study_of(path)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = study.trials[1]
    assert retry.system_attrs["failed_trial"] == 0 and retry.params == study.trials[0].params
    folder = sc.sweep_dir(sc.load(path)) / "trials" / "0"
    assert "(step 4)" in again.stdout  # resumed from the checkpoint SIGTERM wrote, not from row 0's
    fresh = tmp_path / "fresh"
    _, results, _ = execute(sc.load(path).run, retry.user_attrs["overrides"], run_dir=fresh, progress_bar=False, say=quiet)
    assert results.matrix == RunResults.from_json(folder / "results.json").matrix
    assert retry.value == objective(results)


def test_the_shipped_sweep_loads():
    from pathlib import Path

    sweep = sc.load(Path(__file__).resolve().parents[3] / "experiments" / "configs" / "sweeps" / "fast_lr_chunk.yaml")
    assert Path(sweep.run).resolve().name == "default.yaml" and set(sweep.space) == {"cl.fwpkm.lr_values", "cl.fwpkm.chunk"}
    # Forgetting against gain, a Pareto front (a single loss + forgetting objective rewards learning
    # nothing: experiments/LOG.md); several objectives cannot prune.
    assert sweep.objective.is_multi and not sweep.prunes
    ewc = sc.load(Path(__file__).resolve().parents[3] / "experiments" / "configs" / "sweeps" / "ewc_lambda.yaml")
    setup = sc.check_runs(ewc, "ewc_lambda.yaml")  # the fixed overrides and the space load through the run config
    assert setup.config.cl.mode == "finetune" and setup.config.strategy_name == "ewc"


POSTGRES = os.environ.get("CLP_TEST_POSTGRES_URL")


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES, reason="CLP_TEST_POSTGRES_URL is not set (.ci/run starts a loopback server)")
def test_a_sweep_on_a_postgresql_server_runs_continues_and_two_workers_share_it(tiny, tiny_base, tmp_path):
    # A real server (Debian's package, started by .ci/run on loopback): the study lives there, not
    # in the sweep folder; continuing and a second worker process go through the same server.
    name = f"pg-{uuid.uuid4().hex[:8]}"  # the server outlives test runs: one study name per run
    path = write(tiny, tmp_path, name, trials=2, storage=POSTGRES)
    out, study = sw.run(path, say=quiet)
    assert not (out / "study.db").exists()
    assert [(t.number, t.state) for t in study.trials] == [(0, TrialState.COMPLETE), (1, TrialState.COMPLETE)]
    tiny.run_cli(["sweep", str(path), "--trials", "4", "--workers", "2"])
    stored = optuna.load_study(study_name=name, storage=POSTGRES)
    assert [t.number for t in stored.trials] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in stored.trials)
    assert len({t.user_attrs["run_folder"] for t in stored.trials}) == 4
    for t in stored.trials:
        results = RunResults.from_json(out / "trials" / str(t.number) / "results.json")
        assert t.value == objective(results)


def test_an_unreachable_postgresql_server_is_refused_before_any_trial(tiny, tmp_path):
    # Port 1 on loopback: nothing listens there (the driver is installed with the dev extras).
    path = write(tiny, tmp_path, "nowhere", runs=tmp_path / "runs",
                 storage="postgresql+psycopg2://postgres@127.0.0.1:1/postgres")
    with pytest.raises(ConfigError, match="'storage': cannot use database"):
        sw.run(path, say=quiet)
    assert not (tmp_path / "runs").exists()


def test_run_level_overrides_reach_every_trial_and_a_continued_study_must_repeat_them(tiny, tiny_base, tmp_path):
    """`clp sweep FILE runs_root=DIR cl.batch_size=4`: keys that are not the file's go to every trial's
    run config; runs_root may differ between workers (each mounts the shared folder where it can),
    the others are part of the study."""
    path = write(tiny, tmp_path, "moved", trials=1)
    elsewhere = tmp_path / "elsewhere"
    out, study = sw.run(path, overrides=[f"runs_root={elsewhere}", "cl.batch_size=4"], say=quiet)
    assert out == elsewhere / "sweep-moved"
    (trial,) = study.trials
    assert trial.user_attrs["overrides"][:2] == [f"runs_root={elsewhere}", "cl.batch_size=4"]
    assert yaml.safe_load((out / "trials" / "0" / "config.yaml").read_text())["cl"]["batch_size"] == 4
    assert study.user_attrs["sweep"]["run_overrides"] == ["cl.batch_size=4"]
    with pytest.raises(ConfigError, match=r"field 'run_overrides': study 'moved'.*different run_overrides"):
        sw.run(path, overrides=[f"runs_root={elsewhere}", "cl.batch_size=2"], say=quiet)
