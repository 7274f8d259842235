"""Load: four local workers and a second study in one SQLite file, read meanwhile by `nas report`, `nas best`
and optuna-dashboard. No lock error, no lost or duplicated trial, every read answered.

CI runs it for ``NAS_LOAD_TEST_S`` seconds (default 8); by hand, a longer run:

    NAS_LOAD_TEST_S=1800 python -m pytest -q -s -n 0 tests/test_load.py

prints its figures (trials per minute, reads) on the last line; the README quotes a 30-minute run.
Study A walks the 5 members of a tiny six-layer Prism space and then spends adaptive replicates on them
(the default) for as long as the test lasts (100,000 trials asked): four workers share one plan, recomputed
from the storage at every call. Study B, in the same
file, is a one-worker search of another space. Both are stopped with SIGINT at the end, as a user
would stop them, and must exit 130 with their running trials re-queued.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request

import pytest
from optuna.trial import TrialState
from search_helpers import NAS, TINY, counted, load_trials, nas_env, sqlite_url, start_nas, stop, wait_for

from nas.study.records import key_seed

DURATION_S = float(os.environ.get("NAS_LOAD_TEST_S", "8"))
WRITERS_NICENESS = 5  # os.nice of both searches (and their workers): the readers get the core when they ask
MIN_READS = 2  # each reader (report, best, dashboard) answered at least this often while the writers write
pytestmark = [pytest.mark.slow, pytest.mark.timeout(DURATION_S + 900)]  # the duration, then its wind-down
BAD_WORDS = ("database is locked", "Traceback", "OperationalError")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Readers:
    """Threads that keep reading the storage until stopped: CLI readers in subprocesses, and the dashboard's API."""

    def __init__(self, storage: str, cwd, dashboard_port: int) -> None:
        self.storage, self.cwd, self.port = storage, cwd, dashboard_port
        self.stop = threading.Event()
        self.calls: dict[str, int] = {"report": 0, "best": 0, "dashboard": 0}
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._cli, args=(["report", "--study-name", "load-a", "-o",
                                                                   str(cwd / "report.html"), "--plotlyjs", "cdn"],
                                                                  "report")),
                        threading.Thread(target=self._cli, args=(["best", "--study-name", "load-b"], "best")),
                        threading.Thread(target=self._dashboard)]

    def __enter__(self) -> Readers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=300)

    def _cli(self, args: list[str], name: str) -> None:
        while not self.stop.is_set():
            done = subprocess.run([*NAS, *args, "--storage", self.storage], cwd=self.cwd, env=nas_env(),
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0 or any(word in done.stderr for word in BAD_WORDS):
                if "has no" not in done.stderr:  # a study without a completed trial yet says so: not a failure
                    self.failures.append(f"{name}: {done.returncode} {done.stderr[-500:]}")
            self.calls[name] += 1
            self.stop.wait(1.0)

    def _dashboard(self) -> None:
        api = f"http://127.0.0.1:{self.port}/api/studies"
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(api, timeout=30) as response:
                    studies = json.load(response)["study_summaries"]
                for summary in studies:
                    with urllib.request.urlopen(f"{api}/{summary['study_id']}", timeout=30) as response:
                        assert response.status == 200
                        json.load(response)
                self.calls["dashboard"] += 1
            except Exception as error:  # noqa: BLE001 - recorded and reported by the test
                self.failures.append(f"dashboard: {type(error).__name__}: {error}")
            self.stop.wait(1.0)


def study_names(path) -> set[str]:
    """The studies in the SQLite file (read directly: the readers must not start before study B exists)."""
    with sqlite3.connect(path, timeout=60) as db:
        return {name for (name,) in db.execute("SELECT study_name FROM studies")}


def assert_consistent(trials, name: str) -> int:
    """No (shape, seed) counted twice, nothing left RUNNING, every counted trial with its result; the count."""
    done = counted(trials)
    pairs = [key_seed(t) for t in done]
    assert len(pairs) == len(set(pairs)), f"{name}: a (shape, seed) was trained twice"
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], f"{name}: a trial was left RUNNING"
    assert all("eval_curve" in t.user_attrs for t in done), f"{name}: a trial lost its result"
    return len(done)


def test_four_workers_and_a_second_study_under_readers_lose_and_repeat_nothing(tmp_path):
    storage = sqlite_url(tmp_path / "load.db")
    common = [*TINY, "--tokens", "1k", "--trials", "100000", "--storage", storage, "--heartbeat", "2"]
    log_a, log_b, log_d = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "dashboard.log"
    # the writers run at a lower priority: on one core, five busy trainings left each reader a sixth of it (two
    # reports took 2.8 minutes on the slower machine); the readers still meet every write they wait on
    a = start_nas("search", "--space", "prism", "--layers", "6", *common, "--workers", "4", "--threads", "1",
                  "--study-name", "load-a", cwd=tmp_path, log=log_a, cores=None, niceness=WRITERS_NICENESS)
    # study B and the dashboard start once A has made the file's schema, and start up while A's workers do (each
    # start-up imports torch: one after the other they took half a minute of the test on the slower machine)
    wait_for(lambda: "load-a" in study_names(tmp_path / "load.db"), 120, "study A", process=a, log=log_a)
    b = start_nas("search", "--space", "hourglass", *common, "--threads", "1", "--study-name", "load-b",
                  cwd=tmp_path, log=log_b, cores=None, niceness=WRITERS_NICENESS)
    port = free_port()
    dashboard = start_nas("dashboard", "--storage", storage, "--port", str(port), cwd=tmp_path, log=log_d,
                          cores=None)
    started = time.monotonic()
    try:
        wait_for(lambda: any(t.state == TrialState.COMPLETE for t in load_trials(storage, "load-a")), 120,
                 "study A's first trial", poll=2.0, process=a, log=log_a)  # each poll reads the study: not too often
        wait_for(lambda: study_names(tmp_path / "load.db") >= {"load-a", "load-b"}, 120, "study B", process=b,
                 log=log_b)
        wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).status == 200,
                 90, "the dashboard", process=dashboard, log=log_d)
        with Readers(storage, tmp_path, port) as readers:
            # the duration counts from the first read; on a loaded core a report can take several seconds, so the
            # writers go on (at most 2 minutes longer) until every reader has been answered MIN_READS times
            deadline = time.monotonic() + DURATION_S
            while (a.poll() is None and b.poll() is None and time.monotonic() < deadline + 120
                   and (time.monotonic() < deadline or min(readers.calls.values()) < MIN_READS)):
                time.sleep(1.0)
        for process in (a, b):
            process.send_signal(signal.SIGINT)
        a.wait(timeout=300)
        b.wait(timeout=300)
    finally:
        for process in (a, b, dashboard):
            stop(process, signal.SIGTERM)
    elapsed = time.monotonic() - started
    logs = {name: path.read_text() for name, path in (("a", log_a), ("b", log_b), ("dashboard", log_d))}
    assert a.returncode == 130 and b.returncode == 130, (a.returncode, b.returncode, logs["a"][-2000:],
                                                          logs["b"][-2000:])
    for name, text in logs.items():
        bad = [word for word in BAD_WORDS if word in text]
        assert not bad, (name, bad, text[-3000:])
    assert not readers.failures, readers.failures[:5]
    trials_a, trials_b = load_trials(storage, "load-a"), load_trials(storage, "load-b")
    n_a, n_b = assert_consistent(trials_a, "A"), assert_consistent(trials_b, "B")
    interrupted = [t for t in trials_a + trials_b if t.user_attrs.get("status") == "interrupted"]
    assert len(interrupted) <= 5  # at most the trials running when SIGINT came, each re-queued
    assert n_a >= 8 and n_b >= 2 and min(readers.calls.values()) >= MIN_READS, (n_a, n_b, readers.calls)
    print(f"\nload: {elapsed / 60:.1f} min, study A {n_a} trials ({60 * n_a / elapsed:.1f}/min, 4 workers), "
          f"study B {n_b} ({60 * n_b / elapsed:.1f}/min), reads: {readers.calls}, lock errors 0, "
          f"duplicated 0, lost 0, interrupted and re-queued {len(interrupted)}, stale heartbeats retried "
          f"{sum(1 for t in trials_a + trials_b if 'failed_trial' in t.system_attrs)}")
