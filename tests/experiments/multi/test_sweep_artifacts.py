"""Trial checkpoints in Optuna's artifact store: two sweep workers standing in for two machines —
each its own runs root, sharing only the study's storage (an SQLite file, a JournalStorage log
file, or the loopback PostgreSQL server when CLP_TEST_POSTGRES_URL is set) and the artifact folder. The first is
SIGKILLed mid-trial; the second retries that trial with no copy of its run folder, continues it
from the uploaded checkpoint, and the study ends with exactly the requested trials, the retried
one equal to an uninterrupted run."""
import os
import shutil
import time
import uuid

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from analysis.metrics import summary
from cl_platform.check import ConfigError
from cl_platform.results import RunResults
from experiments.multi import sweep as sw
from experiments.multi import sweep_config as sc
from experiments.multi.sweep_artifacts import pointer_key
from experiments.multi.sweep_journal import is_journal, make_journal
from experiments.run import execute

SPACE = {"cl.fwpkm.lr_values": {"type": "float", "low": 0.03, "high": 3.0, "log": True}}
OBJECTIVE = {"terms": {"average_final": 1.0, "average_forgetting": 1.0}, "direction": "minimize"}
POSTGRES = os.environ.get("CLP_TEST_POSTGRES_URL")

# Worker A dies (SIGKILL: no clean-up, no Optuna bookkeeping) right after trial 0's checkpoint of
# run step 6 has been uploaded (this callback runs after the sweep's uploader).
KILL_AFTER_UPLOAD = """
import os, signal, sys
import experiments.run as run
from cl_platform.callbacks import RunCallback

class KillAfterUpload(RunCallback):
    def on_checkpoint(self, runner, path):
        if runner.position.step == 6 and runner.run_dir.name == "0":
            os.kill(os.getpid(), signal.SIGKILL)

real = run.execute
run.execute = lambda *a, callbacks=None, **k: real(*a, callbacks=[*(callbacks or []), KillAfterUpload()], **k)
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def quiet(_):
    pass


def machine(tiny, tiny_base, tmp_path, who, name, storage, artifacts, trials=2):
    """Machine `who`: its own folder with a run config whose runs_root is local and holds a copy
    of the tiny base (as a shipped or earlier-built base would be), and a sweep file on the shared
    storage and artifact folder."""
    home = tmp_path / who
    runs = home / "runs"
    runs.mkdir(parents=True)
    shutil.copytree(tiny_base.path.parent, runs / tiny_base.path.parent.name)
    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache")}
    spec["token_budget"] = {**spec["token_budget"], "dev": 256}
    stream = tiny.write_yaml(home / "stream.yaml", spec)
    tiny.config(home / "run.yaml", stream=str(stream), runs_root=str(runs))
    data = {"run": "run.yaml", "name": name, "trials": trials, "sampler": "random", "seed": 0, "space": SPACE,
            "objective": OBJECTIVE, "pruner": {"name": "none"}, "storage": storage, "artifacts": str(artifacts),
            "heartbeat_interval": 1, "grace_period": 2}
    path = home / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def storage_for(backend, tmp_path):
    if backend == "postgresql":
        if not POSTGRES:
            pytest.skip("CLP_TEST_POSTGRES_URL is not set (.ci/run starts a loopback server)")
        return POSTGRES
    if backend == "journal":  # a log file on the shared disk, no server; sweep_journal's heartbeat
        return f"journal:{tmp_path / 'shared.log'}"
    return f"sqlite:///{tmp_path / 'shared.db'}"


def load_study(name, storage):
    return optuna.load_study(study_name=name, storage=make_journal(storage) if is_journal(storage) else storage)


@pytest.mark.slow
@pytest.mark.parametrize("backend,damaged", [("sqlite", False), ("sqlite", True), ("journal", False),
                                            ("postgresql", False)])
def test_a_trial_killed_on_one_machine_continues_on_another_from_the_artifact_store(tiny, tiny_base, tmp_path,
                                                                                    backend, damaged):
    storage = storage_for(backend, tmp_path)
    name = f"art-{uuid.uuid4().hex[:8]}"  # the server outlives test runs: one study name per run
    shared = tmp_path / "artifacts"
    a = machine(tiny, tiny_base, tmp_path, "a", name, storage, shared)
    b = machine(tiny, tiny_base, tmp_path, "b", name, storage, shared)

    killed = tiny.run_cli(["sweep", str(a)], script=KILL_AFTER_UPLOAD, check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    study = load_study(name, storage)
    assert [t.state for t in study.trials] == [TrialState.RUNNING]
    pointer = study.user_attrs[pointer_key(sc.sweep_dir(sc.load(a)) / "trials" / "0")]
    # Every save uploads: the pointer is at the kill's step, the one before at the save before it.
    assert pointer["step"] == 6 and pointer["previous"]["step"] == 3 and pointer["trial"] == 0
    assert sorted(os.listdir(shared)) == sorted([pointer["artifact"], pointer["previous"]["artifact"]])
    b_trials = sc.sweep_dir(sc.load(b)) / "trials"
    assert not b_trials.exists()  # machine B has nothing of the trial but what the store holds
    if damaged:  # the newest artifact was damaged in transit: the one before it is used
        with open(shared / pointer["artifact"], "r+b") as f:
            f.seek(100)
            f.write(b"\x00" * 64)

    time.sleep(3)  # the grace period passes without a heartbeat
    again = tiny.run_cli(["sweep", str(b)])
    study = load_study(name, storage)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = study.trials[1]
    assert retry.system_attrs["failed_trial"] == 0 and retry.params == study.trials[0].params
    step = 3 if damaged else 6
    assert f"checkpoint of step {step} taken from the artifact store (written by trial 0)" in again.stdout
    assert f"(step {step})" in again.stdout  # the engine resumed there, not from row 0
    assert ("SHA-256 mismatch" in again.stdout) == damaged
    folder = b_trials / "0"
    assert retry.user_attrs["run_folder"] == str(folder)
    # The continued run equals one made without the kill (a fresh folder on machine B).
    _, results, _ = execute(sc.load(b).run, retry.user_attrs["overrides"], run_dir=tmp_path / "fresh",
                            progress_bar=False, say=quiet)
    assert results.matrix == RunResults.from_json(folder / "results.json").matrix
    assert retry.value == summary(results)["average_final"] + summary(results)["average_forgetting"]
    # Exactly the requested trials ran; each lineage keeps at most its two newest artifacts.
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 2
    pointers = {k: v for k, v in study.user_attrs.items() if k.startswith("checkpoint:")}
    assert set(pointers) == {"checkpoint:0", "checkpoint:2"}
    live = {e["artifact"] for p in pointers.values() for e in (p, p["previous"]) if e}
    assert set(os.listdir(shared)) == live


def test_a_sweep_whose_artifact_folder_is_not_writable_is_refused_before_any_trial(tiny, tiny_base, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    path = machine(tiny, tiny_base, tmp_path, "a", "unwritable", f"sqlite:///{tmp_path / 'x.db'}", blocker / "store")
    with pytest.raises(ConfigError, match="field 'artifacts'") as err:
        sw.run(path, say=quiet)
    assert err.value.field == "artifacts"
    assert not (tmp_path / "x.db").exists() and not sc.sweep_dir(sc.load(path)).exists()  # nothing written
