"""Several workers on one study: 4 local processes on the default SQLite storage, 2 on a real PostgreSQL server."""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from multiprocessing import forkserver
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from search_helpers import (
    NAS,
    SPACE3,
    SPACE5,
    TINY,
    assert_no_repeated_work,
    child_pids,
    counted,
    load_trials,
    nas_env,
    open_storage_at,
    pop_queued_trials,
    run_nas,
    sqlite_url,
    start_nas,
    stop,
    wait_for,
)

from nas.rerun.launch import descendants
from nas.study.config import SearchConfig
from nas.study.parallel import run_search, worker_context
from nas.study.placement import Placement
from nas.study.records import key_seed
from nas.study.recovery import INTERRUPTED, TERMINATED
from nas.study.storage import make_storage
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space

pytestmark = pytest.mark.slow


def members_of(options: SpaceOptions) -> list[str]:
    return [arch.key() for arch in build_space(options, defaults=get_preset("tiny").baseline)]


def overlapping(trials: list[FrozenTrial]) -> bool:
    """Did at least two trained trials run at the same time?"""
    spans = sorted((t.datetime_start, t.datetime_complete) for t in counted(trials))
    return any(later_start < earlier_end for (_, earlier_end), (later_start, _) in zip(spans, spans[1:]))


def assert_clean(output: str) -> None:
    assert "locked" not in output and "Traceback" not in output, output


def in_four_processes_at_once(tmp_path, target, *args) -> list[str]:
    """Run ``target(*args, start_at, out)`` in 4 spawned processes that start together; what each wrote."""
    context, start_at = multiprocessing.get_context("spawn"), time.time() + 5
    outs = [tmp_path / f"worker-{w}.out" for w in range(4)]
    workers = [context.Process(target=target, args=(*args, start_at, str(out))) for out in outs]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    return [out.read_text() for out in outs]


def test_workers_starting_together_on_a_fresh_sqlite_file_all_open_it(tmp_path):
    # the first start creates Optuna's tables: the losers of that race retry instead of failing
    assert in_four_processes_at_once(tmp_path, open_storage_at, sqlite_url(tmp_path / "fresh.db")) == ["ok"] * 4


def test_a_queued_trial_goes_to_exactly_one_of_four_racing_sqlite_workers(tmp_path):
    # SQLite ignores SELECT ... FOR UPDATE: without BEGIN IMMEDIATE two workers pop the same trial and train it
    url = sqlite_url(tmp_path / "queue.db")
    study = optuna.create_study(storage=make_storage(url), study_name="queue")
    for x in range(40):
        study.enqueue_trial({"x": x})
    asked = in_four_processes_at_once(tmp_path, pop_queued_trials, url, "queue", 10)
    popped = sorted(n for numbers in asked for n in json.loads(numbers))
    assert popped == list(range(40)), "a queued trial was handed to two workers"


def test_cpu_workers_fork_from_a_server_with_torch_imported_and_take_the_environment_of_their_search(
        tmp_path, monkeypatch):
    """CPU workers are forked from a fork server (``worker_context``), which imported torch and the trainer once;
    a worker must still see the environment of the search that starts it, not the server's from its start: here the
    server starts with a data cache no process can create, and the search runs with the session's."""
    gpu = worker_context([Placement(0, "cuda", "cuda:0", 1)])
    assert gpu.get_start_method() == "spawn"  # a GPU worker is spawned: nothing before it has touched CUDA
    context = worker_context([Placement(0, "cpu", "cpu", 1), Placement(1, "auto", "cpu", 1)])
    assert context.get_start_method() == "forkserver"
    (tmp_path / "a-file").write_text("")
    session_cache = os.environ["NAS_CACHE"]
    monkeypatch.setenv("NAS_CACHE", str(tmp_path / "a-file" / "cache"))  # under a file: cannot be created
    forkserver._forkserver._stop()  # a server an earlier test started would not hold the variable above
    forkserver.ensure_running()
    monkeypatch.setenv("NAS_CACHE", session_cache)
    storage = sqlite_url(tmp_path / "fork.db")
    config = SearchConfig(space=SpaceOptions(space="prism", layers=4), preset="tiny", storage=storage,
                          study_name="fork", trials=3, workers=2, train_overrides=(("tokens", 1_024),))
    run_search(config)
    trials = load_trials(storage, "fork")
    assert_no_repeated_work(trials, 3)


# `nas ...` as `python -m nas` runs it, writing at exit which of the heavy libraries its own process imported
NAS_NOTING_IMPORTS = [sys.executable, "-c", "import atexit, runpy, sys; out = sys.argv.pop(1); "
                      "atexit.register(lambda: open(out, 'w').write(' '.join(m for m in ('torch', 'sqlalchemy') "
                      "if m in sys.modules))); sys.argv[0] = 'nas'; runpy.run_module('nas', run_name='__main__')"]


def test_the_parent_of_cpu_workers_trains_nothing_and_never_imports_torch(tmp_path):
    """Its workers, forked from a fork server that imported torch once, train; the parent plans, reads events and
    counts GPUs from torch's version file (a CPU build here): torch's import would cost it 1.2-1.7 CPU-s and ~150
    MB for nothing."""
    imported = tmp_path / "imported"
    search = ["search", *SPACE3, *TINY, "--tokens", "1k", "--trials", "2", "--workers", "2", "--study-name", "two"]
    proc = subprocess.run([*NAS_NOTING_IMPORTS, str(imported), *search], cwd=tmp_path, env=nas_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "holds 2 trained trials" in proc.stderr.splitlines()[-1], proc.stderr
    assert imported.read_text().split() == ["sqlalchemy"]  # the study's storage, and no torch
    assert_no_repeated_work(load_trials(sqlite_url(tmp_path / "nas.db"), "two"), 2)


def test_four_local_workers_on_the_default_sqlite_storage(tmp_path):
    # 5 members, 8 trials: the exhaustive walk and then the replicates, planned by 4 racing workers
    proc = run_nas("search", *SPACE5, *TINY, "--trials", "8", "--workers", "4", "--study-name", "four",
                   cwd=tmp_path, cores=None)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stderr)
    assert "holds 8 trained trials" in proc.stderr.splitlines()[-1]

    trials = load_trials(sqlite_url(tmp_path / "nas.db"), "four")
    assert_no_repeated_work(trials, 8)  # exact count, no (shape, seed) twice, every result stored
    # the last line's peak memory is the largest process's: a worker's, each trial records its own so far
    printed = float(re.search(r"peak memory (\d+) MB", proc.stderr.splitlines()[-1]).group(1))
    assert printed >= max(t.user_attrs["peak_memory_mb"] for t in counted(trials)) - 1, proc.stderr.splitlines()[-1]
    members = members_of(SpaceOptions(space="prism", layers=6))
    assert sorted(key_seed(t) for t in counted(trials) if t.user_attrs["seed"] == 0) == sorted((m, 0) for m in members)
    assert trials[0].user_attrs["role"] == "baseline"
    # nothing failed but the trials that stood down when workers raced for the last slots
    assert not [t.number for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("surplus")]
    assert not [t.number for t in trials if t.state == TrialState.WAITING]
    # one worker writes the dashboard's note, last once the study is complete: it states the final answer
    from optuna_dashboard._note import get_note_from_system_attrs

    from reports.frame import read_study
    from reports.summary import summarise

    storage = optuna.storages.RDBStorage(sqlite_url(tmp_path / "nas.db"))
    study = optuna.load_study(study_name="four", storage=storage)
    note = get_note_from_system_attrs(storage.get_study_system_attrs(study._study_id), None)["body"]
    assert note.startswith("## four") and f"**{summarise(read_study(study)).sentence}**" in note
    if not overlapping(trials):  # every guarantee above held; only the evidence of parallelism is missing
        pytest.skip("the workers never trained at the same time (machine too loaded to show parallelism)")


def test_workers_starting_together_on_a_fresh_postgresql_database_all_open_it(tmp_path, postgres_url):
    assert in_four_processes_at_once(tmp_path, open_storage_at, postgres_url) == ["ok"] * 4


def test_two_workers_on_two_machines_share_a_postgresql_study(tmp_path, postgres_url):
    # as on two machines: two separate `nas search` commands, the same study name and storage URL,
    # started together (both try to create the study); 5 members > 4 trials, so TPE proposes (and repeats)
    args = ["search", *SPACE5, *TINY, "--trials", "4", "--study-name", "shared", "--storage", postgres_url]
    logs = [tmp_path / "machine-a.log", tmp_path / "machine-b.log"]
    workers = [start_nas(*args, cwd=tmp_path, log=log, cores=(core,)) for core, log in enumerate(logs)]
    try:
        codes = [w.wait(timeout=400) for w in workers]
    finally:
        for w in workers:
            stop(w)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    for output in outputs:
        assert_clean(output)
        assert "holds 4 trained trials" in output.splitlines()[-1]
        assert " (complete, " in output or " (pruned, " in output, "one machine trained nothing"
        assert "1 worker on cpu (1 thread)" in output.splitlines()[0]  # each machine's own placement, pinned
        assert all(" on cpu: " in line for line in output.splitlines() if line.startswith("["))

    trials = load_trials(postgres_url, "shared")
    assert_no_repeated_work(trials, 4)
    assert {t.user_attrs.get("placed_on") for t in counted(trials) if "duplicate_of" not in t.user_attrs} == {"cpu"}
    assert trials[0].user_attrs["role"] == "baseline" and trials[0].state == TrialState.COMPLETE
    assert not [t.number for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("surplus")]
    if not overlapping(trials):  # every guarantee above held; only the evidence of parallelism is missing
        pytest.skip("the two machines never trained at the same time (machine too loaded to show parallelism)")


def start_two_workers(tmp_path: Path, study: str) -> tuple[str, Path, subprocess.Popen]:
    """``nas search --workers 2`` on the 3-member space, 4 trials of 32k tokens (32 reports each), heartbeat 1 s."""
    storage, log = sqlite_url(tmp_path / f"{study}.db"), tmp_path / "search.log"
    process = start_nas("search", *SPACE3, *TINY, "--tokens", "32k", "--trials", "4", "--workers", "2",
                        "--heartbeat", "1", "--storage", storage, "--study-name", study, cwd=tmp_path, log=log,
                        cores=None)
    return storage, log, process


def wait_for_two_trials_training(storage: str, study: str, process, log) -> list[FrozenTrial]:
    """The two running trials once both are between their first report and half of their 32."""
    def two_running() -> list[FrozenTrial]:
        running = [t for t in load_trials(storage, study) if t.state == TrialState.RUNNING
                   and 1 <= len(t.intermediate_values) <= 16]
        return running if len(running) == 2 else []

    return wait_for(two_running, 240, "two trials training at once", process=process, log=log)


def test_a_killed_worker_does_not_hang_the_search_and_its_trial_is_retried(tmp_path):
    # one of two local workers is SIGKILLed mid-trial: the other finishes the study (failing and re-queuing the
    # killed trial once its heartbeat is 3 s old), and the command says so (exit 0: the study is complete)
    # instead of waiting for the dead one
    storage, log, process = start_two_workers(tmp_path, "kill")
    try:
        wait_for_two_trials_training(storage, "kill", process, log)
        os.kill(child_pids(process.pid)[0], signal.SIGKILL)
        code = process.wait(timeout=300)
    finally:
        stop(process)
    output = log.read_text()
    assert code == 0, output
    warning, done = output.splitlines()[-2:]
    assert warning.startswith("warning: worker ") and "died" in warning and "completed the study" in warning, output
    assert done.startswith("done: study 'kill' holds 4 trained trials"), output
    trials = load_trials(storage, "kill")
    assert_no_repeated_work(trials, 4)
    (killed,) = [t for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("surplus")]
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert key_seed(retry) == key_seed(killed) and retry.state == TrialState.COMPLETE
    # 3 members, 4 trials: every member trained once (the killed one too), then one replicate
    assert sorted(key_seed(t) for t in counted(trials) if t.user_attrs["seed"] == 0) == sorted(
        (m, 0) for m in members_of(SpaceOptions(space="prism")))


@pytest.mark.parametrize("sent_signal", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_to_the_parent_stops_every_worker_cleanly(tmp_path, sent_signal):
    # `kill` (SIGTERM) or `kill -INT` reaches only the parent of `--workers 2`; it passes the stop on at once, and
    # each worker marks its running trial interrupted and re-queues it, as Ctrl-C in a terminal (which reaches all of
    # them) does. After `kill -INT` the workers trained on for 3 s and started trials after the stop
    storage, log, process = start_two_workers(tmp_path, "term")
    try:
        victims = wait_for_two_trials_training(storage, "term", process, log)
        sent = datetime.datetime.now()  # Optuna's start times are the machine's local time
        process.send_signal(sent_signal)
        code = process.wait(timeout=60)
    finally:
        stop(process)
    output = log.read_text()
    assert code == 130 and "interrupted" in output.splitlines()[-1] and "Traceback" not in output, output
    trials = load_trials(storage, "term")
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    for victim in victims:
        stopped = trials[victim.number]
        assert stopped.state == TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
        # the stop passed on is the one the search received: the reason said "Ctrl-C" for a SIGTERM
        assert stopped.user_attrs["reason"] == (TERMINATED if sent_signal == signal.SIGTERM else INTERRUPTED)
        (requeued,) = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
        assert requeued.state == TrialState.WAITING and key_seed(requeued) == key_seed(stopped)
    assert not [t.number for t in trials if t.datetime_start and t.datetime_start > sent]  # none began after it


def still_running(pid: int) -> bool:
    """``pid`` exists and is no zombie (a killed orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_to_the_parent_ends_its_workers_and_the_same_command_requeues_their_trials_at_once(tmp_path):
    # `kill -9` reaches only the parent of `--workers 2`: its workers, forked from a fork server that outlives it,
    # must die with it (nas.study.parallel.die_with_search), not train on orphaned beside the resumed search; the
    # same command then finds no search of the file alive and re-queues their two trials at its start
    storage, log, process = start_two_workers(tmp_path, "sigkill")
    try:
        victims = wait_for_two_trials_training(storage, "sigkill", process, log)
        below = descendants(process.pid)  # the fork server, the two workers, the resource tracker
        assert len(child_pids(process.pid)) == 2
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        stop(process)
    wait_for(lambda: not [pid for pid in below if still_running(pid)], 30, "every process of the search to end")
    assert sorted(t.number for t in load_trials(storage, "sigkill") if t.state == TrialState.RUNNING) == sorted(
        v.number for v in victims)  # nobody could mark them
    rerun = run_nas("search", *SPACE3, *TINY, "--tokens", "32k", "--trials", "4", "--workers", "2", "--heartbeat",
                    "1", "--storage", storage, "--study-name", "sigkill", cwd=tmp_path, cores=None)
    assert rerun.returncode == 0, rerun.stderr
    assert "2 trials left running by a search that is gone were re-queued" in rerun.stderr, rerun.stderr
    trials = load_trials(storage, "sigkill")
    assert_no_repeated_work(trials, 4)
    for victim in victims:
        killed = trials[victim.number]
        assert killed.state == TrialState.FAIL and killed.user_attrs["status"] == "abandoned"
        (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
        assert key_seed(retry) == key_seed(killed)


def test_ctrl_c_while_the_fork_server_imports_torch_stops_the_search_in_one_line(tmp_path):
    # a terminal's Ctrl-C reaches the whole process group; in the first seconds that includes a fork server still
    # importing torch, which CPython protects from ^C only afterwards: it printed its KeyboardInterrupt traceback
    # under the search's line (nas.study.parallel.start_fork_server starts it with the signal blocked); and a search
    # stopped while it waits for the server to fork a worker must not leave the server to fork it later
    log = tmp_path / "search.log"
    with open(log, "w") as out:
        process = subprocess.Popen([*NAS, "search", *SPACE3, *TINY, "--tokens", "32k", "--trials", "4", "--workers",
                                    "2", "--storage", sqlite_url(tmp_path / "early.db"), "--study-name", "early"],
                                   cwd=tmp_path, env=nas_env(), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # a group of its own, as a terminal's foreground job
    try:
        def importing_fork_server() -> list[int]:
            return [pid for pid in descendants(process.pid)
                    if "forkserver" in Path(f"/proc/{pid}/cmdline").read_text() and not descendants(pid)]

        (server,) = wait_for(importing_fork_server, 120, "the fork server to start", poll=0.02, process=process,
                             log=log)
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(timeout=120)
    finally:
        stop(process)
    # the server must not outlive the search: left to serve the start it held, it forked a worker after the search
    # had gone, which printed a traceback (nas.study.parallel.kill_fork_server); wait for it before reading the log
    wait_for(lambda: not still_running(server), 60, "the fork server to end")
    output = log.read_text()
    assert code == 130 and "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert output.splitlines()[-1].startswith("interrupted:"), output


def test_machines_sharing_a_study_draw_different_shapes_and_one_seed_draws_the_same_again(tmp_path, one_thread):
    """Two `nas search` processes (worker 0 each, same --seed) on one study must not propose in lockstep: with the
    sampler seeded per process rather than per trial, the second would draw the first one's shape and wait for it."""
    from nas.study.config import SearchConfig
    from nas.study.heartbeat import Heartbeat
    from nas.study.optuna_internals import trial_id
    from nas.study.session import open_search
    from nas.study.trial import run_trial

    def config(name: str) -> SearchConfig:  # 129 schedules, 20 trials: the sampler proposes (TPE, random start-up)
        return SearchConfig(space=SpaceOptions(space="prism"), preset="cpu", storage=sqlite_url(tmp_path / name),
                            study_name="shared", trials=20, train_overrides=(("tokens", 1024),))

    def propose(search, trial):
        with Heartbeat(search.storage, trial_id(trial), trial.number) as heartbeat:
            state, arch, *_ = run_trial(search, trial, heartbeat)
        return state, arch

    machine_a, machine_b = open_search(config("shared.db")), open_search(config("shared.db"))
    machine_a.study.ask()  # trial 0: the queued baseline, left running
    first = propose(machine_b, machine_b.study.ask())
    second = propose(machine_a, machine_a.study.ask())
    assert first[0] == second[0] == "complete" and first[1] != second[1]
    again = open_search(config("again.db"))  # the same command on a fresh study proposes the same shapes
    again.study.ask()
    assert propose(again, again.study.ask())[1] == first[1] and propose(again, again.study.ask())[1] == second[1]


def test_a_queued_trial_that_another_worker_pops_is_not_trained_twice(tmp_path):
    """Found by the 30-minute load test: a worker's read before ``ask`` held a queued, shapeless trial (the retry of
    one that died before it had a shape) and nothing running, so it counted as final. Another worker popped that
    trial and planned the same (shape, seed) into it; this worker, handed the next number, trusted its stale read
    and trained the pair too. A queued trial in the read now sends the check to the storage, which shows the
    other worker's trial running with that pair: this one waits for it and is answered as its duplicate."""
    import threading
    from types import SimpleNamespace

    from nas.arch import uniform
    from nas.study.heartbeat import Heartbeat
    from nas.study.optuna_internals import trial_id
    from nas.study.records import shape_attrs
    from nas.study.trial import find_original, set_attrs

    storage = make_storage(sqlite_url(tmp_path / "queue.db"), heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="queue")
    search = SimpleNamespace(study=study, storage=storage, study_id=storage.get_study_id_from_name("queue"))
    study.enqueue_trial({})  # a retry of a trial that died before it recorded a shape
    known = study.get_trials(deepcopy=False)  # this worker's read before its ask: one queued trial, none running
    arch = uniform(4, 32, 4, 256)
    other = study.ask()  # another worker pops the queued trial and plans the same pair into it
    set_attrs(search, other, shape_attrs(arch, 7, "race"))
    mine = study.ask()
    assert (other.number, mine.number) == (0, 1) and mine.number == len(known)
    set_attrs(search, mine, shape_attrs(arch, 7, "race"))

    def finish_other() -> None:
        time.sleep(1.0)
        other.set_user_attr("val_loss", 3.0)
        study.tell(other, 3.0)

    finisher = threading.Thread(target=finish_other)
    finisher.start()
    with Heartbeat(storage, trial_id(mine), mine.number) as heartbeat:
        original = find_original(search, arch.key(), 7, mine.number, heartbeat, known)
    finisher.join()
    assert original is not None and original.number == other.number
