"""How `clp sweep` workers share a study's target through its storage alone
(experiments/multi/sweep.py: `claims_a_place`): the verdict on each trial from its number and the
states of the trials before it, and several processes racing on one real database, asking for
trials as fast as they can: exactly the target runs, none twice, whatever the interleaving — on
SQLite, PostgreSQL and a JournalStorage log file."""
import multiprocessing as mp
import os
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from experiments.multi.sweep import claims_a_place, counted
from experiments.multi.sweep_journal import is_journal, make_journal

TARGET = 5
WORKERS = 4


def test_the_verdict_follows_the_trial_numbers_and_the_states_before_them(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="claims")
    trials = [study.ask() for _ in range(3)]  # three workers asked at once for the last two places
    verdicts = [claims_a_place(study, t.number, target=2) for t in trials]
    assert verdicts == [True, True, False]
    study.tell(trials[2], state=TrialState.FAIL)  # the surplus one, as the objective marks it
    # A failed trial frees its place: the next new trial takes it...
    study.tell(trials[0], state=TrialState.FAIL)
    again = study.ask()
    assert claims_a_place(study, again.number, target=2)
    # ... and a queued one (a retry, or enqueued by hand) always runs, beyond the target too.
    study.tell(again, 1.0)
    study.enqueue_trial({"x": 0.5})
    queued = study.ask()
    assert "fixed_params" in study.trials[queued.number].system_attrs
    assert claims_a_place(study, queued.number, target=2)
    assert not claims_a_place(study, study.ask().number, target=2)


def race(url: str, name: str, worker: int) -> None:
    """What a `clp sweep` worker does, without the training: count, ask, claim, tell."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    while counted(study) < TARGET:
        trial = study.ask()
        if claims_a_place(study, trial.number, TARGET):
            trial.set_user_attr("worker", worker)
            study.tell(trial, float(trial.number))
        else:
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.FAIL)


def open_storage(url: str):
    if is_journal(url):  # a log file on a shared disk, no server
        return make_journal(url)
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None)


POSTGRES = os.environ.get("CLP_TEST_POSTGRES_URL")
STORAGES = ["sqlite", "journal", pytest.param("postgresql", marks=pytest.mark.skipif(
    not POSTGRES, reason="CLP_TEST_POSTGRES_URL is not set (.ci/run starts a loopback server)"))]


@pytest.mark.parametrize("backend", STORAGES)
@pytest.mark.parametrize("round_", range(3))
def test_racing_workers_run_exactly_the_target(tmp_path, backend, round_):
    url = {"postgresql": POSTGRES, "journal": f"journal:{tmp_path / 'study.log'}"}.get(backend, f"sqlite:///{tmp_path / 'study.db'}")
    name = f"race-{uuid.uuid4().hex[:8]}"  # a server outlives test runs: one study per test
    optuna.create_study(storage=open_storage(url), study_name=name)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=race, args=(url, name, w)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    trials = optuna.load_study(study_name=name, storage=open_storage(url)).trials
    ran = [t for t in trials if not t.user_attrs.get("surplus")]
    assert len(ran) == TARGET and all(t.state == TrialState.COMPLETE for t in ran)
    assert len({t.number for t in ran}) == TARGET
    # Every surplus trial was refused, not run; every other number is one the storage gave once.
    assert all(t.state == TrialState.FAIL and "worker" not in t.user_attrs for t in trials if t not in ran)
    assert sorted(t.number for t in trials) == list(range(len(trials)))
