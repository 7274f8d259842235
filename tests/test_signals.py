"""Ctrl-C at the worst moment: a signal that lands inside a storage write leaves no trial RUNNING."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from search_helpers import sqlite_url

from nas.study import signals
from nas.study.config import SearchConfig
from nas.study.parallel import run_search
from nas.study.signals import interruptible, interrupts_deferred, raise_if_stopped
from search_spaces.factory import SpaceOptions

ROOT = Path(__file__).resolve().parents[1]


def test_a_signal_inside_the_deferred_block_is_delivered_when_it_ends():
    interruptible()
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # a second one is not delivered twice
        reached_the_end = True
    assert reached_the_end
    assert signal.getsignal(signal.SIGINT) is signals._stop  # the handler is back


def swallow_a_ctrl_c() -> None:
    """Ctrl-C landing inside a weakref callback (as it did in SQLAlchemy's ``InstanceState._cleanup`` under load):
    Python prints "Exception ignored in ..." and drops the ``KeyboardInterrupt``."""

    class Collected:
        pass

    thing = Collected()
    ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
    del thing  # the callback runs here; its exception never reaches this frame
    assert ref() is None


SWALLOWED = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # "Exception ignored in"


@SWALLOWED
def test_a_stop_sqlalchemy_catches_logs_and_raises_again_stops_without_a_traceback(tmp_path, caplog):
    """A load test's Ctrl-C to four workers landed while SQLAlchemy's pool reset a connection it was taking back:
    the pool logged "Exception during reset or similar" with the traceback, then raised the KeyboardInterrupt again.
    The stop must still come, without the record."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(sqlite_url(tmp_path / "x.db"))

    def cut_by_a_signal(dbapi_connection) -> None:  # what signals._stop raises wherever the main thread is
        raise KeyboardInterrupt

    interruptible()
    connection = engine.connect()
    engine.dialect.do_rollback = cut_by_a_signal  # the pool's reset on return rolls back
    with caplog.at_level("DEBUG", logger="sqlalchemy.pool"), pytest.raises(KeyboardInterrupt):
        connection.close()
    assert "Exception during reset" not in caplog.text and "Traceback" not in caplog.text, caplog.text
    assert "Invalidate connection" in caplog.text  # the pool's other records still pass ...
    logger = logging.getLogger("sqlalchemy.pool.impl.QueuePool")
    with caplog.at_level("ERROR", logger="sqlalchemy.pool"):
        logger.error("a real pool error", exc_info=ValueError("x"))  # ... and its errors with their tracebacks
    assert "a real pool error" in caplog.text and "ValueError" in caplog.text
    interruptible()


def test_a_stop_whose_exception_python_swallowed_is_raised_at_the_next_check():
    interruptible()
    raise_if_stopped()  # none came: nothing
    swallow_a_ctrl_c()  # no exception here: that is the defect the record exists for
    with pytest.raises(KeyboardInterrupt):
        raise_if_stopped()
    with pytest.raises(signals.Terminated):  # a later stop is delivered as it comes ...
        signal.raise_signal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as raised:  # ... and does not replace the first one's kind
        raise_if_stopped()
    assert not isinstance(raised.value, signals.Terminated)
    interruptible()  # a fresh start forgets the old stop
    raise_if_stopped()


TWO_STOPS_IN_A_WORKER = """
import os, signal
from nas.study.signals import interruptible, raise_if_stopped

interruptible(once=ONCE)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
os.kill(os.getpid(), signal.SIGTERM)  # the group's SIGTERM and the search's SIGINT, both pending when a worker
os.kill(os.getpid(), signal.SIGINT)  # that was starting unblocks them
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
    print("not stopped")
except KeyboardInterrupt as stop:
    print("stopped by", type(stop).__name__)
    for _ in range(3):
        os.kill(os.getpid(), signal.SIGINT)  # more while it reports the stop
    print("reported")
try:
    raise_if_stopped()
except KeyboardInterrupt:
    print("still stopped")
"""


@pytest.mark.parametrize("once", [True, False])
def test_a_worker_stops_once_however_many_stop_signals_reach_it(once):
    run = subprocess.run([sys.executable, "-c", TWO_STOPS_IN_A_WORKER.replace("ONCE", str(once))],
                         capture_output=True, text=True, timeout=60)
    if once:  # the first raises, the rest are recorded: the worker reports its stop in one piece
        assert run.returncode == 0 and run.stderr == "", run.stderr
        first, *rest = run.stdout.splitlines()  # Python runs pending handlers in signal-number order: SIGINT's
        assert first in ("stopped by KeyboardInterrupt", "stopped by Terminated") and rest == ["reported",
                                                                                              "still stopped"]
    else:  # the search's own process: every Ctrl-C raises (a second one may cut its clean-up short)
        assert run.returncode != 0 and "KeyboardInterrupt" in run.stderr


SWALLOWED_IN_A_PROCESS = """
import signal, sys, weakref
from nas.study.signals import interruptible, raise_if_stopped

class Collected:
    '''A weak reference target.'''

def raise_a_value_error(_):
    raise ValueError("a real error in a callback")

interruptible()
thing = Collected()
ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
del thing  # Ctrl-C lands in a weakref callback: Python drops its KeyboardInterrupt
other = Collected()
ref_2 = weakref.ref(other, raise_a_value_error)
del other  # any other dropped exception is printed as before
try:
    raise_if_stopped()
except KeyboardInterrupt:
    print("stopped")
"""


def test_a_swallowed_stop_prints_no_traceback_and_other_dropped_exceptions_still_do():
    """A load test's Ctrl-C to four workers landed in SQLAlchemy's ``_collection_gced`` (a weakref callback): the stop
    came, but Python printed "Exception ignored in ... Traceback ... KeyboardInterrupt" above the clean stop's line.
    In a fresh process (pytest puts its own hook in place), as a user's terminal shows it."""
    done = subprocess.run([sys.executable, "-c", SWALLOWED_IN_A_PROCESS], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", (done.stdout, done.stderr)
    assert "KeyboardInterrupt" not in done.stderr, done.stderr
    assert "ValueError: a real error in a callback" in done.stderr, done.stderr  # every other one still shows


@SWALLOWED
def test_a_search_whose_ctrl_c_was_swallowed_still_stops_and_requeues_its_trial(tmp_path, one_thread, monkeypatch):
    import nas.study.worker

    interruptible()
    storage = sqlite_url(tmp_path / "swallowed.db")
    plan, calls = nas.study.worker.plan_next, [0]

    def plan_then_swallowed_ctrl_c(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:
            swallow_a_ctrl_c()  # outside any deferral: the search would train on for good without the record
        return plan(*args, **kwargs)

    monkeypatch.setattr(nas.study.worker, "plan_next", plan_then_swallowed_ctrl_c)
    config = SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="swallowed",
                          trials=50, train_overrides=(("tokens", 1_000),))
    with pytest.raises(KeyboardInterrupt):
        run_search(config)
    trials = optuna.load_study(study_name="swallowed", storage=storage).get_trials(deepcopy=False)
    assert calls[0] == 3  # it stopped in the trial the signal came in, not some trials later
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], "a trial was left RUNNING"
    assert [t.number for t in trials if t.user_attrs.get("status") == "interrupted"] == [2]
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2


@pytest.mark.parametrize("asks_before", [0, 2])  # the queued baseline, or a planned member after two trials
def test_a_signal_right_after_ask_committed_its_trial_leaves_it_interrupted_and_requeued(tmp_path, one_thread,
                                                                                        monkeypatch, asks_before):
    interruptible()
    storage = sqlite_url(tmp_path / "ask.db")
    ask, calls = optuna.Study.ask, [0]

    def ask_then_ctrl_c(self, *args, **kwargs):
        trial = ask(self, *args, **kwargs)  # the storage holds the RUNNING trial now
        calls[0] += 1
        if calls[0] == asks_before + 1:
            signal.raise_signal(signal.SIGINT)  # before the caller has the trial in hand
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask_then_ctrl_c)
    config = SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="ask",
                          trials=3, train_overrides=(("tokens", 1_000),))
    with pytest.raises(KeyboardInterrupt):
        run_search(config)
    trials = optuna.load_study(study_name="ask", storage=storage).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], "a trial was left RUNNING"
    (interrupted,) = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert interrupted.number == asks_before
    if "key" in interrupted.user_attrs:  # it had its shape (the queued baseline does): the same shape is queued again
        (retry,) = [t for t in trials if t.state == TrialState.WAITING]
        assert retry.user_attrs["key"] == interrupted.user_attrs["key"]


def real_busy_error(tmp_path) -> optuna.exceptions.StorageInternalError:
    """What Optuna raises when SQLite answers "database is locked": made by a real lock on a real file."""
    import sqlite3

    import sqlalchemy

    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    try:
        sqlite3.connect(path, timeout=0, isolation_level=None).execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as orig:
        try:
            raise sqlalchemy.exc.OperationalError("BEGIN IMMEDIATE", {}, orig) from orig
        except sqlalchemy.exc.OperationalError as wrapped:
            error = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
            error.__cause__ = wrapped
            return error
    finally:
        holder.close()
    raise AssertionError("SQLite did not report the lock")


def test_marking_a_trial_interrupted_waits_out_a_busy_database_and_still_requeues_it(tmp_path, monkeypatch):
    """The load test's failure: a worker stopped by Ctrl-C met "database is locked" while marking its trial. Busy
    answers are retried (the session dropped first); any other storage error is not."""
    from nas.study.recovery import mark_interrupted
    from nas.study.storage import make_storage

    storage = make_storage(sqlite_url(tmp_path / "nas.db"))
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.set_user_attr("key", "shape-a")
    trial.set_user_attr("seed", 3)
    busy = real_busy_error(tmp_path)
    assert "database is locked" in str(busy.__cause__)
    original, failures = storage.set_trial_user_attr, []

    def flaky(trial_id, key, value):
        if len(failures) < 2:
            failures.append(key)
            raise busy
        return original(trial_id, key, value)

    monkeypatch.setattr(storage, "set_trial_user_attr", flaky)
    mark_interrupted(study, trial)
    trials = study.get_trials(deepcopy=False)
    assert failures == ["status", "status"] and trials[0].state == TrialState.FAIL
    assert trials[0].user_attrs["status"] == "interrupted"
    assert trials[1].state == TrialState.WAITING and trials[1].user_attrs["key"] == "shape-a"

    other = study.ask()
    monkeypatch.setattr(storage, "set_trial_user_attr",
                        lambda *a, **k: (_ for _ in ()).throw(optuna.exceptions.StorageInternalError("disk full")))
    with pytest.raises(optuna.exceptions.StorageInternalError, match="disk full"):
        mark_interrupted(study, other)


def test_marking_a_trial_interrupted_after_a_signal_cut_a_query_short_on_its_connection(tmp_path):
    """The CI failure: Ctrl-C landed inside a storage read, whose SELECT stayed pending on the pooled connection after
    the session's rollback. A pending statement keeps its WAL snapshot, so once another worker commits, every
    ``BEGIN IMMEDIATE`` on that connection answers "database is locked" at once (no busy wait helps); marking the
    trial must take a fresh connection, not retry on the stale one."""
    import sqlite3

    from nas.study.recovery import mark_interrupted
    from nas.study.storage import make_storage

    url = sqlite_url(tmp_path / "nas.db")
    storage = make_storage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.set_user_attr("key", "shape-a")
    backend = storage._backend if hasattr(storage, "_backend") else storage
    session = backend.scoped_session()
    dbapi = session.connection().connection.dbapi_connection  # the session's transaction began (BEGIN IMMEDIATE)
    cut_short = dbapi.cursor()
    cut_short.execute("SELECT trial_id FROM trials")  # the signal landed before its row was read: the statement
    # stays pending (SQLAlchemy's row processing was cut short in the CI failure)
    session.close()  # what Optuna's session context does on the way out: the transaction is rolled back
    other_worker = optuna.load_study(study_name="s", storage=make_storage(url))
    other_worker.ask()  # another worker commits after the cut-short snapshot
    mark_interrupted(study, trial)
    trials = study.get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["status"] == "interrupted"
    assert [t.user_attrs.get("key") for t in trials if t.state == TrialState.WAITING] == ["shape-a"]
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):  # the stale connection was closed, not reused
        dbapi.execute("SELECT 1")


def test_a_stopping_worker_whose_storage_refuses_the_mark_says_so_in_one_line_and_the_trial_is_retried_later(
        tmp_path, monkeypatch, capsys):
    """``mark_stopped``: the stop is not replaced by a traceback when the storage cannot take the mark; the trial,
    left RUNNING with its heartbeat stopped, is failed as stale and re-queued by the next run (``fail_stale``)."""
    import time

    import sqlalchemy

    from nas.study.recovery import fail_stale, mark_stopped
    from nas.study.storage import make_storage

    storage = make_storage(sqlite_url(tmp_path / "nas.db"), heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    trial.set_user_attr("key", "shape-a")
    storage.record_heartbeat(trial._trial_id)
    real = storage.set_trial_user_attr

    def refused(*args, **kwargs):
        raise optuna.exceptions.StorageInternalError("commit failed") from sqlalchemy.exc.OperationalError(
            "UPDATE", {}, Exception("disk I/O error"))

    monkeypatch.setattr(storage, "set_trial_user_attr", refused)
    mark_stopped(study, trial)  # no exception: the stop goes on
    warning = capsys.readouterr().err.strip()
    assert warning.count("\n") == 0 and f"could not mark trial {trial.number} interrupted" in warning
    assert "disk I/O error" in warning and "re-queues it" in warning
    monkeypatch.setattr(storage, "set_trial_user_attr", real)
    assert study.get_trials(deepcopy=False)[0].state == TrialState.RUNNING
    time.sleep(2.5)  # past the grace period: the next run's stale check
    assert fail_stale(study, storage, study._study_id) == 1
    trials = study.get_trials(deepcopy=False)
    assert trials[0].state == TrialState.FAIL  # with its reason (Optuna's own check failed it without one)
    assert trials[0].user_attrs["status"] == "abandoned" and "its heartbeat stopped" in trials[0].user_attrs["reason"]
    assert [t.user_attrs for t in trials if t.state == TrialState.WAITING] == [{"key": "shape-a"}]

    monkeypatch.setattr(storage, "set_trial_user_attr", lambda *a, **k: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):  # not a storage failure: raised, not hidden
        mark_stopped(study, study.ask())


STOP_BEFORE_THE_COMMAND_HANDLES_IT = """
import os, signal, sys
import nas.study.config
import typer.core

stop = getattr(signal, sys.argv[2])
if sys.argv[3] == "while loading":  # after the options are read, while torch still loads, before the command's handler
    nas.study.config.precheck = lambda config: os.kill(os.getpid(), stop)
elif sys.argv[3] == "swallowed while loading":  # the same, its exception caught by the code it landed in
    def swallowing(config):
        try:
            os.kill(os.getpid(), stop)
        except BaseException:
            pass
    nas.study.config.precheck = swallowing
else:  # while the command line is read
    read = typer.core.TyperGroup.make_context
    def reading(*args, **kwargs):
        os.kill(os.getpid(), stop)
        return read(*args, **kwargs)
    typer.core.TyperGroup.make_context = reading
sys.argv = ["nas", "search", "--space", "prism", "--trials", "1", "--storage", sys.argv[1]]
from nas.cli import main
main()
"""


@pytest.mark.parametrize("where", ["while loading", "swallowed while loading", "while the command line is read"])
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_a_stop_before_a_command_handles_it_is_one_line_and_exit_130(tmp_path, stop, where):
    """A Ctrl-C then exited 130 without a word (typer's own handling); a SIGTERM ended the process (143, silent), and
    one whose exception the code it landed in swallowed was lost: the training ran to its end."""
    database = tmp_path / "nas.db"
    done = subprocess.run([sys.executable, "-c", STOP_BEFORE_THE_COMMAND_HANDLES_IT, f"sqlite:///{database}", stop,
                           where], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    lines = done.stderr.splitlines()
    assert lines == ["interrupted: the command stopped before it finished; run the same command again"], lines
    assert not database.exists()  # it stopped before the search opened the storage


SWALLOWED_BEFORE_RULES = """
import os, signal, sys
import typer.core

stop = getattr(signal, sys.argv[2])
read = typer.core.TyperGroup.make_context
def reading(*args, **kwargs):  # a stop while the command line is read, its exception caught where it landed
    try:
        os.kill(os.getpid(), stop)
    except BaseException:
        pass
    return read(*args, **kwargs)
typer.core.TyperGroup.make_context = reading
sys.argv = ["nas", "rules", "--study-name", "none", "--storage", sys.argv[1]]
from nas.cli import main
main()
"""


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_nas_rules_stops_on_a_stop_that_an_import_swallowed(tmp_path, stop):
    """`nas rules` (a read, or a --confirm that trains) read the storage and answered after a stop whose exception
    was swallowed before its handler ran: it stops instead, as search, train and rerun do."""
    database = tmp_path / "nas.db"
    done = subprocess.run([sys.executable, "-c", SWALLOWED_BEFORE_RULES, f"sqlite:///{database}", stop],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["interrupted: the command stopped before it finished; run the same command "
                                        "again"], done.stderr
    assert not database.exists()


def in_a_terminal() -> None:
    """A child's SIGINT as a terminal's foreground command has it, whatever the test runner's is: a pytest-xdist
    worker ignores SIGINT, and a process keeps an inherited SIG_IGN until its own code changes it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


STOP_WHILE_THE_APPLICATION_LOADS = """
import importlib.abc, os, signal, sys

class StopOnTyper(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "typer":  # nas.cli loads the framework: a Ctrl-C lands in the middle of the imports
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, StopOnTyper())
sys.argv = ["nas", "studies"]
from nas.console import main
main()
"""


def test_a_ctrl_c_while_the_application_loads_is_one_line_and_exit_130():
    """The console script imported ``nas.cli`` (typer and every command, about 0.1 s) before any code could catch a
    stop: a Ctrl-C then printed Python's KeyboardInterrupt traceback."""
    done = subprocess.run([sys.executable, "-c", STOP_WHILE_THE_APPLICATION_LOADS], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, preexec_fn=in_a_terminal)
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["interrupted: the command stopped before it finished; run the same command "
                                        "again"], done.stderr


def test_ctrl_c_in_a_benchmark_figure_is_one_line_and_exit_130(tmp_path):
    """`nas bench` stopped mid-figure printed a 45-line KeyboardInterrupt traceback. Started with SIGINT ignored (a
    background job, or a pytest-xdist worker's child), `python -m benchmarks` ran on to its end and exit 0."""
    from search_helpers import nas_env

    out = tmp_path / "bench"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "--smoke", "--only", "1", "--out", str(out)],
                            cwd=tmp_path, env=nas_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline().startswith("[1/13] prism_free"), "the figure did not start"
        proc.send_signal(signal.SIGINT)
        said = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (130, -signal.SIGINT), said  # both read 130 in a shell
    assert said.splitlines() == ["interrupted: no figure had finished: nothing was written; run the same command "
                                 "again for the rest"], said


def test_a_stop_as_the_command_ends_says_its_work_was_done_and_one_while_it_works_says_run_it_again(monkeypatch):
    """A Ctrl-C in the instant after a command's work returned (its output being flushed) said "stopped before it
    finished; run the same command again", of a command with nothing left to do; one while the command works still
    says that."""
    from typer.testing import CliRunner

    import nas.cli.errors
    import nas.cli.space
    from nas.cli import app
    from nas.errors import INTERRUPTED_DONE_LINE, INTERRUPTED_EXIT_CODE, INTERRUPTED_LINE

    def stopped() -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(nas.cli.errors, "flush_stdout", stopped)
        done = CliRunner().invoke(app, ["space", "count", "--space", "prism"])
    assert done.exit_code == INTERRUPTED_EXIT_CODE
    assert done.output.splitlines()[-1] == INTERRUPTED_DONE_LINE and "129" in done.output  # the count was printed
    monkeypatch.setattr(nas.cli.space, "build_space", lambda *args, **kwargs: stopped())
    working = CliRunner().invoke(app, ["space", "count", "--space", "prism"])
    assert working.exit_code == INTERRUPTED_EXIT_CODE and working.output.strip() == INTERRUPTED_LINE
