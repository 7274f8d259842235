"""Resume: a ``nas search`` killed (SIGKILL) or interrupted (Ctrl-C) mid-trial loses nothing and finishes on re-run."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time

import optuna
import pytest
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState
from search_helpers import (
    SPACE3,
    TINY,
    assert_no_repeated_work,
    counted,
    load_trials,
    run_nas,
    sqlite_url,
    start_nas,
    stop,
    wait_for,
)

import nas.study.heartbeat
import nas.study.recovery
import nas.study.trial
from nas.study.config import SearchConfig
from nas.study.liveness import lease
from nas.study.parallel import run_search
from nas.study.records import counts, key_seed
from nas.study.session import open_search
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space

pytestmark = pytest.mark.slow

TRIALS = 3
# 32k tokens: a trial lasts 4 s or more (an 8k-token trial took 1.1 s on an idle machine, too short to interrupt
# reliably) and reports its validation loss every 1k tokens (32 times)
SEARCH = ["search", *SPACE3, *TINY, "--tokens", "32k", "--trials", str(TRIALS), "--heartbeat", "1"]
REPORTS = 32


MEMBERS = [arch.key() for arch in build_space(SpaceOptions(space="prism"), defaults=get_preset("tiny").baseline)]


def search_args(storage: str, study: str) -> list[str]:
    return [*SEARCH, "--storage", storage, "--study-name", study]


def running_mid_trial(storage: str, study: str) -> FrozenTrial | None:
    """A trial after the baseline that is training right now: it reported some evaluations, at most half."""
    for t in load_trials(storage, study):
        if t.state == TrialState.RUNNING and t.number >= 1 and "key" in t.user_attrs \
                and 1 <= len(t.intermediate_values) <= REPORTS // 2:
            return t
    return None


def retries_of(trials: list[FrozenTrial], number: int) -> list[FrozenTrial]:
    """Trials Optuna re-queued for trial ``number`` (``RetryHeartbeatStaleTrialCallback``'s mark)."""
    return [t for t in trials if t.system_attrs.get("failed_trial") == number]


def assert_walked_every_member_once(trials: list[FrozenTrial]) -> None:
    """``--trials`` equals the space's 3 members: each trained once with the first seed, no replicate, no leftovers."""
    assert sorted(key_seed(t) for t in counted(trials)) == sorted((key, 0) for key in MEMBERS)
    assert not [t.number for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]


def kill_mid_trial(tmp_path, storage: str, study: str) -> FrozenTrial:
    """Start the search, SIGKILL it while a trial after the baseline trains; that trial as it was then."""
    log = tmp_path / f"{study}.log"
    process = start_nas(*search_args(storage, study), cwd=tmp_path, log=log)
    try:
        victim = wait_for(lambda: running_mid_trial(storage, study), 240, "a running trial", process=process, log=log)
    finally:
        stop(process, signal.SIGKILL)
    assert load_trials(storage, study)[victim.number].state == TrialState.RUNNING  # nobody could mark it
    return victim


def test_a_search_killed_mid_trial_resumes_to_exactly_the_requested_trials(tmp_path):
    storage = sqlite_url(tmp_path / "resume.db")
    victim = kill_mid_trial(tmp_path, storage, "killed")
    rerun = run_nas(*search_args(storage, "killed"), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "database is locked" not in rerun.stderr
    trials = load_trials(storage, "killed")
    assert_no_repeated_work(trials, TRIALS)  # exactly TRIALS counted, none left RUNNING
    killed = trials[victim.number]
    assert killed.state == TrialState.FAIL and not counts(killed)
    # no search of the file was alive when the re-run started (nas.study.liveness): it re-queued the trial at once,
    # without waiting for the heartbeat's grace period, and said so
    assert killed.user_attrs["status"] == "abandoned" and "search process was gone" in killed.user_attrs["reason"]
    assert "left running by a search that is gone" in rerun.stdout + rerun.stderr
    (retry,) = retries_of(trials, victim.number)  # re-queued once, with the same shape and seed, and trained
    assert key_seed(retry) == key_seed(killed) and counts(retry) and retry.state == TrialState.COMPLETE
    assert retry.user_attrs["role"] == killed.user_attrs["role"] == "member"
    assert_walked_every_member_once(trials)


def test_a_killed_trial_found_stale_after_the_rerun_planned_more_work_is_still_retried(tmp_path, one_thread):
    # re-run at once, in this process: the killed trial still looks alive for the 3 s grace period, so the
    # re-run first trains the next member, then finds the trial stale; its shape must still be trained
    # (a search of the same file is alive meanwhile, e.g. on another machine: the lease below; alone, the re-run
    # would re-queue the trial at once, as the test above checks)
    storage = sqlite_url(tmp_path / "late.db")
    victim = kill_mid_trial(tmp_path, storage, "late")
    events = []
    with lease(storage) as other_search:
        assert other_search.held
        run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="late",
                                trials=TRIALS, heartbeat_interval=1, train_overrides=(("tokens", 32_000),)),
                   on_event=events.append)
    trials = load_trials(storage, "late")
    assert_no_repeated_work(trials, TRIALS)
    assert_walked_every_member_once(trials)
    (retry,) = retries_of(trials, victim.number)
    assert counts(retry) and key_seed(retry) == key_seed(trials[victim.number])
    # failed by the heartbeat check (at the start or later), not as orphaned, and it says why
    assert trials[victim.number].user_attrs["reason"] == nas.study.recovery.STALE_REASON
    # alone: the next member first, then the retry; on a loaded machine the grace period may already have passed
    # when the re-run starts, and the retry comes first. Either way this re-run trained the killed shape.
    assert retry.number in [e.number for e in events] and len(events) <= 2


def test_a_trial_whose_heartbeat_stopped_before_the_search_started_is_failed_with_its_reason_and_said(tmp_path,
                                                                                                     one_thread):
    """Where another search of the storage is alive (another machine; a database server keeps no lock at all), a
    trial a killed worker left is failed by its stale heartbeat: Optuna's check failed it without a status or a
    reason, and the resumed search said nothing of it."""
    storage = sqlite_url(tmp_path / "stale.db")
    config = SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="stale",
                          trials=1, heartbeat_interval=1)
    run_search(config)  # the baseline
    study = optuna.load_study(study_name="stale", storage=storage)
    space = build_space(SpaceOptions(space="prism"), defaults=get_preset("tiny").baseline)
    member = list(space)[1]
    study.enqueue_trial(space.params_of(member), user_attrs={"key": member.key(), "seed": 0})
    left = study.ask(study.trials[0].distributions)  # a worker took a member, beat once, and was killed
    study._storage.record_heartbeat(left._trial_id)
    time.sleep(4.5)  # past the grace period of 3 heartbeats, on SQLite's clock of whole seconds (3.5 s could read 3)
    with lease(storage) as other_search:
        assert other_search.held
        search = run_search(dataclasses.replace(config, trials=2))
    assert "1 trial whose heartbeat had stopped (a worker killed, or cut off from the storage) was failed, and " \
           "re-queued where its retries allow" in search.notes
    trials = load_trials(storage, "stale")
    failed = trials[left.number]
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "abandoned"
    assert failed.user_attrs["reason"] == nas.study.recovery.STALE_REASON
    (retry,) = retries_of(trials, left.number)
    assert counts(retry) and key_seed(retry) == (member.key(), 0)


def test_ctrl_c_marks_the_running_trial_interrupted_requeues_it_and_exits_130(tmp_path):
    # started as a shell starts a background job, with SIGINT ignored (Python then keeps ignoring it unless
    # told otherwise): `kill -INT` must stop it cleanly all the same, as Ctrl-C does in a terminal
    storage, log = sqlite_url(tmp_path / "ctrl-c.db"), tmp_path / "first.log"
    process = start_nas(*search_args(storage, "ctrl-c"), cwd=tmp_path, log=log, sigint_ignored=True)
    try:
        victim = wait_for(lambda: running_mid_trial(storage, "ctrl-c"), 240, "a running trial", process=process,
                          log=log)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130, log.read_text()
    finally:
        stop(process, signal.SIGKILL)
    assert "interrupted" in log.read_text().splitlines()[-1]
    assert "Traceback" not in log.read_text()

    trials = load_trials(storage, "ctrl-c")
    interrupted = trials[victim.number]
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["status"] == "interrupted"
    assert interrupted.user_attrs["reason"] == nas.study.recovery.INTERRUPTED and not counts(interrupted)
    (requeued,) = retries_of(trials, victim.number)
    assert requeued.state == TrialState.WAITING and key_seed(requeued) == key_seed(interrupted)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    assert sum(counts(t) for t in trials) == victim.number  # everything finished before it is kept

    rerun = run_nas(*search_args(storage, "ctrl-c"), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    trials = load_trials(storage, "ctrl-c")
    assert_no_repeated_work(trials, TRIALS)
    assert counts(trials[requeued.number]) and trials[requeued.number].state == TrialState.COMPLETE
    assert_walked_every_member_once(trials)


def test_a_worker_whose_trial_was_failed_as_stale_meanwhile_goes_on(tmp_path, one_thread, monkeypatch):
    # a starved worker's heartbeat went stale: another worker failed its trial and re-queued it while it trained;
    # writing the result then fails, and the worker must go on (the retry trains the shape), not crash
    import nas.study.trial

    storage = sqlite_url(tmp_path / "starved.db")
    train = nas.study.trial.run_proxy
    lost: list[int] = []

    def train_while_another_worker_fails_the_trial(*args, **kwargs):
        result = train(*args, **kwargs)
        if not lost:
            study = optuna.load_study(study_name="starved", storage=storage)
            (running,) = [t for t in study.get_trials() if t.state == TrialState.RUNNING and t.number > 0]
            study._storage.set_trial_state_values(running._trial_id, TrialState.FAIL)
            optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study._storage.get_trial(running._trial_id))
            lost.append(running.number)
        return result

    monkeypatch.setattr(nas.study.trial, "run_proxy", train_while_another_worker_fails_the_trial)
    events = []
    run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="starved",
                            trials=TRIALS), on_event=events.append)
    trials = load_trials(storage, "starved")
    assert_no_repeated_work(trials, TRIALS)
    assert_walked_every_member_once(trials)
    assert [e.state for e in events if e.number == lost[0]] == ["stale"]
    (retry,) = retries_of(trials, lost[0])
    assert counts(retry) and key_seed(retry) == key_seed(trials[lost[0]])


def test_a_trial_abandoned_before_its_first_heartbeat_does_not_hang_the_search(tmp_path, one_thread, monkeypatch):
    # a worker killed between ask() and its first heartbeat leaves a RUNNING trial that Optuna's stale check never
    # fails (it has no heartbeat row); a waiting worker must fail it and re-queue its shape after ABANDONED_AFTER_S
    monkeypatch.setattr(nas.study.recovery, "ABANDONED_AFTER_S", 1.0)
    storage = sqlite_url(tmp_path / "abandoned.db")
    config = SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="abandoned",
                          trials=TRIALS, heartbeat_interval=1, train_overrides=(("tokens", 8_000),))
    orphan = open_search(config).study.ask()  # pops the queued baseline, as a worker that dies right after would
    time.sleep(1.5)
    finished = threading.Event()
    worker = threading.Thread(target=lambda: (run_search(config), finished.set()), daemon=True)
    with lease(storage):  # the orphan's worker seems alive (another machine's, say): no shortcut at the start
        worker.start()
        worker.join(timeout=240)
    assert finished.is_set(), "the search still waits on the abandoned trial"
    trials = load_trials(storage, "abandoned")
    abandoned = trials[orphan.number]
    assert abandoned.state == TrialState.FAIL and abandoned.user_attrs["status"] == "abandoned"
    assert abandoned.user_attrs["reason"] == "its worker died before the first heartbeat"
    (retry,) = retries_of(trials, orphan.number)
    assert key_seed(retry) == key_seed(abandoned) and counts(retry) and retry.user_attrs["role"] == "baseline"
    assert_no_repeated_work(trials, TRIALS)
    assert_walked_every_member_once(trials)


def test_a_trial_whose_heartbeat_was_lost_stops_training_and_is_finished_once_by_its_retry(tmp_path, one_thread,
                                                                                           monkeypatch):
    # the database stops answering this worker's heartbeats while it trains; past the grace period another worker
    # fails the trial as stale and re-queues it; when the connection is back the worker must stop training the lost
    # trial and drop its result (the retry trains the shape): the trial is finished once, not twice
    storage = sqlite_url(tmp_path / "lost.db")
    train = nas.study.trial.run_proxy
    lost: list[int] = []
    warnings: list[str] = []
    monkeypatch.setattr(nas.study.heartbeat, "warn_on_stderr", warnings.append)
    real_beat = optuna.storages.RDBStorage.record_heartbeat

    def record_heartbeat(self, trial_id):
        if lost and not self_taken.is_set():
            raise sqlalchemy.exc.OperationalError("UPDATE trial_heartbeats", {},
                                                  Exception("server closed the connection"))
        return real_beat(self, trial_id)

    self_taken = threading.Event()
    monkeypatch.setattr(optuna.storages.RDBStorage, "record_heartbeat", record_heartbeat)

    def train_while_the_database_drops_the_heartbeat(arch, cfg, data, report):
        if lost or arch.heads == (4, 4, 4, 4):  # the baseline trains as usual; the first member loses its trial
            return train(arch, cfg, data, report)
        study = optuna.load_study(study_name="lost", storage=storage)
        (running,) = [t for t in study.get_trials() if t.state == TrialState.RUNNING]
        lost.append(running.number)
        wait_for(lambda: len(warnings) >= 1, timeout=30, what="the heartbeat warning")
        study._storage.set_trial_state_values(running._trial_id, TrialState.FAIL)  # as fail_stale_trials would
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study._storage.get_trial(running._trial_id))
        self_taken.set()  # the connection is back: the next beat gets through and reads the trial's state
        wait_for(lambda: any("is back after" in w for w in warnings), timeout=30, what="a beat getting through")
        return train(arch, cfg, data, report)  # its first report finds the trial lost

    monkeypatch.setattr(nas.study.trial, "run_proxy", train_while_the_database_drops_the_heartbeat)
    events = []
    run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="lost",
                            trials=TRIALS, heartbeat_interval=1, train_overrides=(("tokens", 8_192),)),
               on_event=events.append)
    trials = load_trials(storage, "lost")
    assert_no_repeated_work(trials, TRIALS)
    assert_walked_every_member_once(trials)
    (event,) = [e for e in events if e.number == lost[0]]
    assert event.state == "stale" and "re-queued by another worker" in event.reason, (event.state, event.reason)
    first = trials[lost[0]]
    assert first.state == TrialState.FAIL and "val_loss" not in first.user_attrs  # its result was dropped
    assert len(first.intermediate_values) <= 1  # it stopped at its first evaluation after the loss
    (retry,) = retries_of(trials, lost[0])
    assert counts(retry) and key_seed(retry) == key_seed(first)
    assert "failed 3 times in a row: (builtins.Exception) server closed the connection" in warnings[0]


def test_a_complete_study_resumed_with_workers_starts_none_and_still_writes_its_note(tiny_study, monkeypatch):
    """Its trials are all there: the search writes the final note itself, as worker 0 would have before returning,
    and starts neither the fork server nor a worker (~3.5 s of a resumed 200-trial study's 5.4 s)."""
    import nas.study.parallel

    def no_workers(places):
        raise AssertionError("a worker was started for a complete study")

    monkeypatch.setattr(nas.study.parallel, "worker_context", no_workers)
    notes = []
    search = run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=tiny_study, trials=4,
                                     study_name="proxy", workers=2), note=lambda study, force: notes.append(force))
    assert notes == [True]
    assert sum(counts(t) for t in search.study.get_trials(deepcopy=False)) == 4
    with pytest.raises(AssertionError, match="a worker was started"):  # one trial more: the workers start
        run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=tiny_study, trials=5,
                                study_name="proxy", workers=2))
