"""When the storage fails under a running search: wait for a database that restarts, stop with one line otherwise.

Optuna's ``RDBStorage`` turns SQLAlchemy errors into ``StorageInternalError`` (the original is its
``__cause__``); some reads raise SQLAlchemy's own. Two kinds are told apart:

- **transient**: the connection was lost (a PostgreSQL server restarted, a network blip):
  SQLAlchemy marks such errors ``connection_invalidated``, and a server that is starting or
  shutting down says so. The worker waits, probing the database every few seconds, for up to
  ``STORAGE_WAIT_S``; the trial it held is re-queued with its shape and seed, and the search goes on;
- **permanent**: anything else (a full disk, a read-only file, a dropped table): the worker stops
  with one line naming the storage. What is stored stays as the database's last commit left it, and
  the same command resumes once the cause is gone (the trial it held is found stale and retried).
"""

from __future__ import annotations

import time

import optuna
import sqlalchemy

from nas.errors import SearchAborted
from nas.study.config import display_url
from nas.study.heartbeat import warn_on_stderr

STORAGE_WAIT_S = 300.0  # how long a worker waits for a database that went away
PROBE_EVERY_S = 2.0
TRANSIENT_MARKS = ("server closed the connection", "could not connect", "connection refused",
                   "terminating connection", "the database system is", "connection already closed",
                   "ssl connection has been closed", "connection reset", "no connection to the server")


class StorageUnavailable(SearchAborted):
    """The storage failed and did not come back; the message names it and says how to resume."""


def storage_failure(error: BaseException) -> sqlalchemy.exc.SQLAlchemyError | None:
    """The database error behind ``error`` (itself, or the cause Optuna wrapped), or None if it is not one."""
    if isinstance(error, optuna.exceptions.StorageInternalError):
        error = error.__cause__ if error.__cause__ is not None else error
        if not isinstance(error, sqlalchemy.exc.SQLAlchemyError):
            return sqlalchemy.exc.SQLAlchemyError(str(error))
    if isinstance(error, sqlalchemy.exc.IntegrityError):
        return None  # a conflict between workers, handled where it happens
    if isinstance(error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                          sqlalchemy.exc.InternalError, sqlalchemy.exc.DatabaseError,
                          sqlalchemy.exc.PendingRollbackError)):
        return error
    return None


def first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:300]


def is_transient(error: sqlalchemy.exc.SQLAlchemyError) -> bool:
    if getattr(error, "connection_invalidated", False):
        return True
    text = first_line(error).lower()
    return any(mark in text for mark in TRANSIENT_MARKS)


def _reachable(storage: optuna.storages.BaseStorage) -> bool:
    engine = getattr(getattr(storage, "_backend", storage), "engine", None)
    if engine is None:
        return True
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        return True
    except sqlalchemy.exc.SQLAlchemyError:
        return False


def wait_for_storage(storage: optuna.storages.BaseStorage, url: str, error: sqlalchemy.exc.SQLAlchemyError,
                     wait_s: float = STORAGE_WAIT_S) -> None:
    """Return once the storage answers again after the transient ``error``; raise ``StorageUnavailable`` when
    ``error`` is permanent or the storage stays away for ``wait_s`` seconds."""
    where = display_url(url)
    if not is_transient(error):
        raise StorageUnavailable(f"storage {where!r} failed: {first_line(error)}; what it holds is as its last "
                                 "commit left it: fix the cause and run the same command to resume") from None
    warn_on_stderr(f"lost the connection to storage {where!r} ({first_line(error)}); waiting up to "
                   f"{wait_s:.0f} s for it to come back")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _reachable(storage):
            warn_on_stderr(f"storage {where!r} is back; the interrupted trial is re-queued")
            return
        time.sleep(PROBE_EVERY_S)
    raise StorageUnavailable(f"storage {where!r} did not come back within {wait_s:.0f} s ({first_line(error)}); "
                             "run the same command to resume once it is up") from None
