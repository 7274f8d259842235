"""The signals that stop a search cleanly, and the storage writes they must not cut in half.

SIGINT (Ctrl-C, ``kill -INT``) and SIGTERM (``kill``, a batch scheduler's notice before SIGKILL)
raise ``KeyboardInterrupt`` in the worker, whose handler marks the running trial interrupted and
re-queues it. Python runs a signal's handler between any two bytecodes, so a signal that lands
inside ``study.ask()`` after the storage has committed the new RUNNING trial, but before the
worker holds it, would leave that trial RUNNING with nobody to re-queue it (until its heartbeat,
which never started, is found missing). ``interrupts_deferred`` closes such windows: a signal
that arrives inside it is delivered when it ends, once the worker knows what it holds.

A handler's exception can also be lost: Python runs it wherever the main thread is, garbage
collection included, and an exception raised inside a weakref callback or a ``__del__`` is printed
("Exception ignored in: ...") and dropped. A load test caught it: Ctrl-C landed in SQLAlchemy's
``InstanceState._cleanup`` and the search trained on for five minutes. So the handler also records
the signal, and ``raise_if_stopped`` (between trials, at every evaluation of a training, in the
parent's event loop) raises it again until the process stops. Python still printed the dropped exception's
traceback ("Exception ignored in: <function _collection_gced ...>", a load test's Ctrl-C to four workers) above the
clean stop's one line; ``quiet_swallowed_stops`` drops that print for a stop already recorded, and passes every other
"Exception ignored" on to Python's hook.

Where a library catches the handler's exception, logs it and raises it again, the stop is not lost but its log
record would print a traceback under the clean stop's one line: SQLAlchemy's pool logs "Exception during reset or
similar" with the ``KeyboardInterrupt`` when the signal lands while it returns a connection (a load test's Ctrl-C
to four workers). ``QuietStop`` drops such records; every other record passes.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is; unlike Ctrl-C in a terminal, it reached this process alone."""


_received: list[int] = []  # the stop signals this process has received since ``interruptible``
_once = False  # ``interruptible(once=True)``: the first stop signal raises, later ones are only recorded


def _stop_exception(signum: int) -> KeyboardInterrupt:
    return Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt()


def _stop(signum: int, frame: Any) -> None:
    _received.append(signum)
    if _once:  # before raising: a second signal already pending runs this handler here, once, and raises instead
        for stop in STOP_SIGNALS:
            signal.signal(stop, _stopping)  # not SIG_IGN: Python reports a pending signal it finds ignored
    raise _stop_exception(signum)


def _stopping(signum: int, frame: Any) -> None:
    """The handler after the first stop of an ``interruptible(once=True)`` process: recorded, not raised."""
    _received.append(signum)


class QuietStop(logging.Filter):
    """Drop a log record whose exception is a stop (``KeyboardInterrupt``, ``Terminated``): the library re-raises it
    and the search stops with its own line (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, KeyboardInterrupt)


QUIET_LOGGERS = ("sqlalchemy.pool",)  # libraries that log a caught stop before raising it again (and their children)


def quiet_stops() -> None:
    """``QuietStop`` on each of ``QUIET_LOGGERS`` and the loggers below them (a filter acts only on records made at
    its own logger: SQLAlchemy logs at one per pool class, ``sqlalchemy.pool.impl.QueuePool``)."""
    import sqlalchemy.pool  # noqa: F401  (defines the pool classes' loggers)

    names = [name for name in logging.Logger.manager.loggerDict
             if any(name == q or name.startswith(q + ".") for q in QUIET_LOGGERS)]
    for name in {*QUIET_LOGGERS, *names}:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietStop) for f in logger.filters):
            logger.addFilter(QuietStop())


def _drop_a_recorded_stop(unraisable: Any) -> None:
    """``sys.unraisablehook``: a stop exception that Python would print and drop is dropped silently when its signal
    is recorded (``raise_if_stopped`` raises it again); anything else goes to the hook that was there before."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def quiet_swallowed_stops() -> None:
    """Install ``_drop_a_recorded_stop`` as ``sys.unraisablehook`` (once; the hook found there is kept behind it)."""
    global _previous_unraisablehook
    if sys.unraisablehook is not _drop_a_recorded_stop:
        _previous_unraisablehook = sys.unraisablehook
        sys.unraisablehook = _drop_a_recorded_stop


def raise_if_stopped() -> None:
    """Raise ``KeyboardInterrupt`` (``Terminated`` for SIGTERM) if a stop signal came whose exception was swallowed
    (module docstring); a no-op when none came."""
    if _received:
        raise _stop_exception(_received[0])


def interruptible(once: bool = False) -> None:
    """Make SIGINT and SIGTERM raise ``KeyboardInterrupt``: a clean stop, the running trial re-queued.

    A shell starts background jobs (``nas search ... &``, ``nohup``) with SIGINT ignored, and
    Python then leaves it ignored; ``kill -INT`` must still stop a search as Ctrl-C does in a
    terminal. SIGTERM stops it the same way instead of leaving the trial to be found stale after
    the heartbeat grace period.

    ``once`` (a search's worker process): the first stop signal raises and the later ones are only recorded. A worker
    gets two for one stop (a terminal's Ctrl-C or a SIGTERM to the group reaches it, and the search passes one on),
    and the second raised anywhere in the first one's handling, even after the worker's last line of code (a
    traceback). A first one whose exception was swallowed is still raised again by ``raise_if_stopped`` at the next
    evaluation or trial.
    """
    global _once
    if threading.current_thread() is threading.main_thread():
        _once = once
        _received.clear()
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
    if "sqlalchemy" in sys.modules:  # else the storage installs them when it opens (``nas.study.storage``):
        quiet_stops()  # `nas train` opens none, and importing SQLAlchemy here cost it 0.2 s
    quiet_swallowed_stops()


def _hung_up(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def stop_on_hangup() -> None:
    """Make SIGHUP (the terminal closed, an ssh session dropped) raise ``Terminated``, as SIGTERM does: the command
    cleans up and stops in one line instead of dying where it stood. A hangup ignored when the process started
    (``nohup``) stays ignored; off the main thread (where Python delivers no signal) nothing changes."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, _hung_up)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs; deliver the first one that came, as it came, when it ends.

    Off the main thread (where Python delivers no signal) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append(signum)) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])  # the restored handler runs now: KeyboardInterrupt, Terminated, or nothing
