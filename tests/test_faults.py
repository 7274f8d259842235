"""Faults during a search: SIGKILL at random points, a PostgreSQL outage, a full disk; nothing stored is lost.

Every scenario ends with the same check (``assert_no_repeated_work``): the study holds exactly
the requested trials, each with its result, none left RUNNING, no (shape, seed) counted twice.
``KILLS`` counts the kills survived (the README quotes it).

Kill points, injected by a wrapper that starts ``nas search`` in a fresh interpreter (nothing of
this is in the tool itself): ``training`` (at a random intermediate evaluation), ``final
evaluation`` (inside the last evaluation, before any result is written), ``result write`` (the
transaction that stores a trial's result has run its statements and dies before its commit), and
``anytime`` (a timer at a random moment, startup and storage reads included). Two kill loops (each
point struck once) run side by side, one per core the test process may use. With ``--workers 2`` the whole
process group, then one worker, is killed from outside at a random moment.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from optuna.trial import TrialState
from search_helpers import (
    SPACE3,
    TINY,
    assert_no_repeated_work,
    load_trials,
    nas_env,
    run_nas,
    sqlite_url,
    start_nas,
    stop,
    wait_for,
)

pytestmark = pytest.mark.slow

KILLS = {"survived": 0}
POINTS = ("training", "final evaluation", "result write", "anytime")
FIRST_POINTS = (0, 2)  # the kill loops' first points: with two attempts each, every point is struck once
TRIALS = 8  # 3 members walked, then 5 adaptive replicate trials
SEARCH = ["search", *SPACE3, *TINY, "--trials", str(TRIALS), "--heartbeat", "1", "--threads", "1"]

FAULTY_NAS = r"""
import os, random, signal, sys, threading

os.sched_setaffinity(0, {int(os.environ["NAS_FAULT_CORE"])})  # before torch reads its thread count
rng = random.Random(int(os.environ["NAS_FAULT_SEED"]))
point = os.environ["NAS_FAULT_POINT"]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def nth_call(module, name, n, before=None):
    original, calls = getattr(module, name), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n and (before is None or before(*args, **kwargs)):
            die()
        return original(*args, **kwargs)

    setattr(module, name, wrapper)


if point == "training":
    import runners.proxy
    nth_call(runners.proxy, "evaluate", rng.randint(1, 6))
elif point == "final evaluation":
    import runners.proxy
    nth_call(runners.proxy, "final_evaluation", rng.randint(1, 2))
elif point == "result write":
    import sqlalchemy.orm
    import nas.study.optuna_internals as internals
    armed, target = [0], rng.randint(1, 2)
    original_write, original_commit = internals.write_user_attrs, sqlalchemy.orm.Session.commit

    def write(storage, trial_id, attrs):
        if "val_loss" in attrs:
            armed[0] += 1
        return original_write(storage, trial_id, attrs)

    def commit(self):
        if armed[0] == target:  # the result's upsert has run in this transaction; die before it commits
            die()
        return original_commit(self)

    internals.write_user_attrs = write
    sqlalchemy.orm.Session.commit = commit
elif point == "anytime":
    threading.Timer(rng.uniform(1.0, 6.0), die).start()
elif point == "pause":  # not a kill: the second trained trial waits at its second evaluation while a file exists
    import time
    import nas.study.trial
    import runners.proxy
    pause_file, trained, evaluations = os.environ["NAS_PAUSE_FILE"], [0], [0]
    original_train, original_evaluate = nas.study.trial.train, runners.proxy.evaluate

    def train(*args, **kwargs):
        trained[0], evaluations[0] = trained[0] + 1, 0
        return original_train(*args, **kwargs)

    def evaluate(*args, **kwargs):
        evaluations[0] += 1
        if trained[0] == 2 and evaluations[0] == 2:
            open(pause_file, "w").close()
            deadline = time.monotonic() + 600
            while os.path.exists(pause_file) and time.monotonic() < deadline:
                time.sleep(0.05)
        return original_evaluate(*args, **kwargs)

    nas.study.trial.train, runners.proxy.evaluate = train, evaluate

from nas.cli import app
sys.argv = ["nas", *sys.argv[1:]]
app()
"""


def faulty_search(args: list[str], cwd: Path, point: str, seed: int, core: int) -> subprocess.CompletedProcess[str]:
    """``nas`` with a kill at ``point`` (``none``: no fault), on ``core`` alone (the wrapper pins itself: a
    ``preexec_fn`` is not safe in a process with threads, and the kill loops run in threads)."""
    env = {**nas_env(), "NAS_FAULT_POINT": point, "NAS_FAULT_SEED": str(seed), "NAS_FAULT_CORE": str(core)}
    return subprocess.run([sys.executable, "-c", FAULTY_NAS, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def assert_clean_finish(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "database is locked" not in proc.stderr, proc.stderr[-3000:]


def kill_loop(folder: Path, first_point: int, core: int) -> int:
    """One study killed up to twice, at two of the four points in turn from ``first_point`` (two studies strike each
    point once), then resumed to the end and checked; returns the kills it survived.
    Its processes run on ``core`` alone."""
    folder.mkdir()
    storage = sqlite_url(folder / "faults.db")
    args = [*SEARCH, "--storage", storage, "--study-name", "faults"]
    rng = random.Random(first_point)
    kills = 0
    for attempt in range(2):
        point = POINTS[(first_point + attempt) % len(POINTS)]
        proc = faulty_search(args, folder, point, rng.randrange(2**31), core)
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert_clean_finish(proc)  # the fault point was not reached: the search finished
        break
    else:
        assert_clean_finish(faulty_search(args, folder, "none", 0, core))  # the same command, no fault
    assert kills >= 1, f"{POINTS[first_point]}: the faults seldom struck, the test tests little"
    trials = load_trials(storage, "faults")
    assert_no_repeated_work(trials, TRIALS)
    assert not [t.number for t in trials if t.state == TrialState.WAITING]
    assert sqlite3.connect(folder / "faults.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)
    return kills


def test_searches_killed_again_and_again_at_random_points_resume_to_exactly_the_requested_trials(tmp_path):
    """Two studies, from the first and the third kill point, each killed up to twice and resumed (``kill_loop``).

    The studies are independent and each pins its processes to one core, so they run side by side, one
    per core this process may use (one at a time in a pytest-xdist lane of one core, two at a time in a
    serial run on 2 cores)."""
    cores: queue.SimpleQueue[int] = queue.SimpleQueue()
    for core in sorted(os.sched_getaffinity(0)):
        cores.put(core)

    def on_a_free_core(first_point: int) -> int:
        core = cores.get()
        try:
            return kill_loop(tmp_path / POINTS[first_point].replace(" ", "-"), first_point, core)
        finally:
            cores.put(core)

    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        kills = list(pool.map(on_a_free_core, FIRST_POINTS))
    print(f"\nkills per first point {dict(zip((POINTS[i] for i in FIRST_POINTS), kills))}")
    KILLS["survived"] += sum(kills)


def worker_pids(parent: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
    except OSError:
        return []


def test_two_workers_killed_at_random_moments_resume_to_exactly_the_requested_trials(tmp_path):
    """The whole group, then one worker, SIGKILLed from outside at a random moment; then resumed."""
    storage = sqlite_url(tmp_path / "two.db")
    args = [*SEARCH, "--trials", "8", "--workers", "2", "--storage", storage, "--study-name", "two"]
    rng = random.Random(7)
    kills = 0
    for attempt in range(2):
        log = tmp_path / f"attempt{attempt}.log"
        process = start_nas(*args, cwd=tmp_path, log=log, cores=None)
        time.sleep(rng.uniform(3.0, 9.0))
        if process.poll() is not None:
            break  # finished before the kill
        children = worker_pids(process.pid)
        if attempt % 2 and children:  # one worker: the others finish or report it, the parent exits
            os.kill(rng.choice(children), signal.SIGKILL)
            process.wait(timeout=300)
        else:  # the parent: its workers die with it
            stop(process, signal.SIGKILL)
            wait_for(lambda pids=children: not any(Path(f"/proc/{c}").exists() for c in pids), 30, "the workers to die")
        kills += 1
    assert kills >= 2
    KILLS["survived"] += kills
    proc = run_nas(*args, cwd=tmp_path, cores=None, timeout=600)
    assert_clean_finish(proc)
    assert_no_repeated_work(load_trials(storage, "two"), 8)


def start_paused_search(tmp_path: Path, storage: str, study: str) -> tuple[subprocess.Popen, Path, Path]:
    """A 4-trial search that pauses its second trial at an evaluation until the pause file is removed: (its process,
    its log, the pause file, which exists once it has paused)."""
    pause = tmp_path / "paused"
    args = [*SEARCH, "--trials", "4", "--storage", storage, "--study-name", study]
    log = tmp_path / "search.log"
    env = {**nas_env(), "NAS_FAULT_POINT": "pause", "NAS_FAULT_SEED": "0", "NAS_PAUSE_FILE": str(pause),
           "NAS_FAULT_CORE": str(sorted(os.sched_getaffinity(0))[0])}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-c", FAULTY_NAS, *args], cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, text=True)
    return process, log, pause


def test_a_postgresql_outage_under_a_running_search_is_waited_out_and_loses_nothing(tmp_path, postgres_control,
                                                                                   postgres_url):
    """The server goes down while a trial trains and comes back once the search has noticed.

    The trial does not have to be caught in a window: the search pauses its second trial at an evaluation
    (``pause`` in the wrapper), the server is stopped, the trial goes on into the outage, and the server is
    started again once the search says it lost the connection: the same on a slow machine and a fast one.
    """
    process, log, pause = start_paused_search(tmp_path, postgres_url, "outage")
    try:
        wait_for(pause.exists, 600, "the second trial to pause in training", process=process, log=log)
        postgres_control.stop()  # every connection of the search is terminated
        pause.unlink()
        try:
            wait_for(lambda: "lost the connection to storage" in log.read_text(), 300, "the search to notice",
                     process=process, log=log)
        finally:
            postgres_control.start()
        process.wait(timeout=600)
    finally:
        stop(process)
    output = log.read_text()
    assert process.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "lost the connection to storage" in output and "is back" in output, output[-3000:]
    trials = load_trials(postgres_url, "outage")
    assert_no_repeated_work(trials, 4)
    interrupted = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert interrupted and all("storage connection was lost" in t.user_attrs["reason"] for t in interrupted)


def test_ctrl_c_while_the_postgresql_server_is_away_says_the_trial_could_not_be_marked(tmp_path, postgres_control,
                                                                                     postgres_url):
    """Stopped while it waited for the server, the search said "a trial that was running is marked and re-queued",
    and nothing was: the trial stayed RUNNING, for the next run's heartbeat check."""
    process, log, pause = start_paused_search(tmp_path, postgres_url, "away")
    try:
        wait_for(pause.exists, 600, "the second trial to pause in training", process=process, log=log)
        postgres_control.stop()
        pause.unlink()
        try:
            wait_for(lambda: "lost the connection to storage" in log.read_text(), 300, "the search to notice",
                     process=process, log=log)
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
        finally:
            postgres_control.start()
    finally:
        stop(process)
    output = log.read_text()
    assert process.returncode == 130 and "Traceback" not in output, output[-3000:]
    assert "interrupted (the storage is unreachable); the next run of the same command re-queues it" in output, \
        output[-3000:]
    assert "is marked and re-queued" not in output
    assert output.strip().splitlines()[-1] == ("interrupted: re-run the same command to resume; a trial that was "
                                               "running is trained again with its shape and seed")
    assert [t.state for t in load_trials(postgres_url, "away")].count(TrialState.RUNNING) == 1  # as the line says


def mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def fill(folder: Path) -> Path:
    """Write a file until the file system is full."""
    filler = folder / "filler"
    # unbuffered: a buffered file keeps what ENOSPC refused and flushes it again on close, outside the suppress
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):  # ENOSPC ends the loop: the disk is full
        while True:
            f.write(b"\0" * 65536)
    return filler


def test_a_full_disk_stops_the_search_with_one_line_and_it_resumes_when_space_is_back(tmp_path):
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not mount_tmpfs(disk, "4m"):
        pytest.skip("cannot mount a small tmpfs here (needs root and mount permission)")
    try:
        storage = sqlite_url(disk / "full.db")
        args = [*SEARCH, "--trials", "8", "--storage", storage, "--study-name", "full"]
        log = tmp_path / "search.log"
        process = start_nas(*args, cwd=tmp_path, log=log)
        try:
            wait_for(lambda: sum(t.state == TrialState.COMPLETE for t in load_trials(storage, "full")) >= 2, 240,
                     "two complete trials", process=process, log=log)
            filler = fill(disk)
            process.wait(timeout=300)
        finally:
            stop(process)
        output = log.read_text()
        assert process.returncode == 1, output[-3000:]
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and str(disk / "full.db") in errors[0] and "full" in errors[0], output[-3000:]
        assert "Traceback" not in output
        assert sqlite3.connect(disk / "full.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert sum(t.state == TrialState.COMPLETE for t in load_trials(storage, "full")) >= 2  # nothing lost
        filler.unlink()  # space is back: the same command resumes
        assert_clean_finish(run_nas(*args, cwd=tmp_path))
        trials = load_trials(storage, "full")
        assert_no_repeated_work(trials, 8)
        # a trial the stop left RUNNING (the disk filled between its ask and its first heartbeat, or mid-training)
        # was re-queued when the resume started (nas.study.liveness), not after a wait for a heartbeat
        assert not [t.number for t in trials if t.user_attrs.get("status") == "abandoned"
                    and "search process was gone" not in t.user_attrs.get("reason", "")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_at_least_five_kills_were_survived():
    """Runs after the kill tests of this module (pytest keeps file order): the figure the README quotes."""
    print(f"\nkills survived: {KILLS['survived']}")
    assert KILLS["survived"] >= 5, KILLS
