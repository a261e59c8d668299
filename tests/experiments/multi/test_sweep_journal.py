"""A sweep on Optuna's JournalStorage (a log file, no server) gets the heartbeat Optuna gives only
RDB storage (experiments/multi/sweep_journal.py): a running trial beats; a trial whose beats stop
is failed once and retried once, however many workers find it stale at the same moment; a fresh
retry, which inherits the killed trial's last beat, is not stale."""
import multiprocessing as mp
import time

import optuna
import pytest
from optuna.trial import TrialState

from experiments.multi import sweep_config as sc
from experiments.multi.sweep_journal import HEARTBEAT, absolute, beating, fail_stale, make_journal


def journal_study(tmp_path, name="j"):
    url = f"journal:{tmp_path / 'study.log'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return url, optuna.create_study(storage=make_journal(url), study_name=name, load_if_exists=True)


def test_a_running_trial_beats_until_its_block_ends(tmp_path):
    url, study = journal_study(tmp_path)
    trial = study.ask()
    assert HEARTBEAT not in study.trials[0].system_attrs
    with beating(study._storage, trial._trial_id, interval=0.2):
        first = study.trials[0].system_attrs[HEARTBEAT]  # a beat at once
        time.sleep(0.7)
        later = make_journal(url).get_all_trials(study._study_id)[0].system_attrs[HEARTBEAT]  # another process's view
    assert first < later
    ended = study.trials[0].system_attrs[HEARTBEAT]
    time.sleep(0.5)
    assert study.trials[0].system_attrs[HEARTBEAT] == ended  # no beat after the block


def test_a_trial_without_beats_is_failed_and_retried_and_a_beating_one_is_not(tmp_path):
    _, study = journal_study(tmp_path)
    dead, alive = study.ask(), study.ask()
    study._storage.set_trial_system_attr(dead._trial_id, HEARTBEAT, time.time() - 10)
    time.sleep(1.2)  # both started over a second ago; only `alive` beats now
    study._storage.set_trial_system_attr(alive._trial_id, HEARTBEAT, time.time())
    assert fail_stale(study, grace_period=1, max_retry=2) == [0]
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    retry = study.trials[2]
    assert retry.system_attrs["failed_trial"] == 0
    assert retry.system_attrs[HEARTBEAT] == study.trials[0].system_attrs[HEARTBEAT]  # the dead trial's last beat
    # Popped by a worker, the retry carries the dead trial's old beat but a fresh start: not stale.
    popped = study.ask()
    assert popped.number == 2
    assert fail_stale(study, grace_period=1, max_retry=2) == []
    assert study.trials[2].state == TrialState.RUNNING
    # A trial killed before its first beat is judged by its start.
    never = study.ask()
    assert fail_stale(study, grace_period=1, max_retry=0) == [] and never.number == 3
    time.sleep(1.2)
    assert fail_stale(study, grace_period=1, max_retry=0) == [1, 2, 3]
    # max_retry=0: failed, not queued again.
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 4


def hunt(url, name, grace, out, start):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name=name, storage=make_journal(url))
    start.wait()  # all four look at the same moment: the race is real, not one after another
    out.put(fail_stale(study, grace_period=grace, max_retry=3))


@pytest.mark.parametrize("round_", range(2))
def test_workers_racing_for_one_stale_trial_queue_exactly_one_retry(tmp_path, round_):
    url, study = journal_study(tmp_path, name=f"race-{round_}")
    trial = study.ask()
    study._storage.set_trial_system_attr(trial._trial_id, HEARTBEAT, time.time() - 60)
    time.sleep(1.2)  # started over a second ago, last beat a minute ago
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=hunt, args=(url, study.study_name, 1, out, start)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    failed = [out.get(timeout=5) for _ in procs]
    assert sorted(failed) == [[], [], [], [0]]  # one worker failed it; the others saw it done
    states = [t.state for t in optuna.load_study(study_name=study.study_name, storage=make_journal(url)).trials]
    assert states == [TrialState.FAIL, TrialState.WAITING]  # one retry, not four


def test_a_journal_storage_is_checked_before_any_trial(tmp_path):
    where = "sweep config x.yaml"
    sc.check_storage(absolute(f"journal:{tmp_path / 'ok.log'}"), "storage", where)  # a folder that takes files
    with pytest.raises(sc.ConfigError, match=r"field 'storage': cannot use database .*: folder .*missing does not exist"):
        sc.check_storage(f"journal:{tmp_path / 'missing' / 'study.log'}", "storage", where)
    (tmp_path / "dir.log").mkdir()
    with pytest.raises(sc.ConfigError, match=r"dir\.log is not a file"):
        sc.check_storage(f"journal:{tmp_path / 'dir.log'}", "--storage", where)
    assert not (tmp_path / "ok.log").exists() and not (tmp_path / "missing").exists()  # nothing written
