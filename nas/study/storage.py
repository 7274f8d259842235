"""Optuna storage from a SQLAlchemy URL: SQLite by default, PostgreSQL (or any RDB) for many machines.

SQLite serves several local worker processes without "database is locked" because the
file is switched to write-ahead logging (readers never block the writer; the mode is
persistent in the file) and every connection waits up to ``SQLITE_BUSY_TIMEOUT_S`` for
the write lock instead of failing after Python's default 5 s. Every transaction starts
with ``BEGIN IMMEDIATE``: SQLite ignores ``SELECT ... FOR UPDATE`` and Python's sqlite3
starts a transaction only at its first write, so Optuna's read-check-write updates (taking
a queued trial, finishing a trial) would otherwise race, and two workers could both pop
the same queued trial and train it.

Heartbeats: each running trial records a heartbeat every ``heartbeat_interval`` seconds;
a trial whose heartbeat is older than ``grace_period`` (its worker was killed) is failed
by the next worker and re-queued with the same shape and seed (Optuna's
``RetryHeartbeatStaleTrialCallback``).
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import time
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url

from nas.errors import UsageError

DEFAULT_STORAGE = "sqlite:///nas.db"
SQLITE_BUSY_TIMEOUT_S = 600
MAX_RETRIES = 3  # a shape whose worker dies this many times is left failed
CREATE_ATTEMPTS = 5  # opening a fresh database: tries while other workers race to create its tables


def parse_url(url: str) -> sqlalchemy.URL:
    """Validate a storage URL; one-line error naming it and what would be valid."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy raises ArgumentError, ValueError...
        raise UsageError(f"storage URL {url!r} is malformed: use e.g. sqlite:///nas.db or "
                         "postgresql://user:password@host:5432/db") from None
    if parsed.get_backend_name() == "sqlite" and not parsed.database:
        raise UsageError(f"storage URL {url!r} names no file: use e.g. sqlite:///nas.db (in-memory SQLite "
                         "cannot be shared between workers)")
    return parsed


def _with_driver(parsed: sqlalchemy.URL) -> sqlalchemy.URL:
    """``postgresql://`` names no driver and SQLAlchemy 2.1 defaults it to psycopg 3; use the one installed."""
    if parsed.drivername != "postgresql":
        return parsed
    for module in ("psycopg2", "psycopg"):  # psycopg2 first: the ``postgres`` extra installs it
        if importlib.util.find_spec(module) is not None:
            return parsed.set(drivername=f"postgresql+{module}")
    return parsed


def _prepare_sqlite(path: str) -> None:
    """Create the file's folder and switch it to WAL journaling (a persistent property of the file)."""
    file = Path(path)
    if file.parent and not file.parent.exists():
        raise UsageError(f"storage folder {str(file.parent)!r} does not exist")
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            with closing(sqlite3.connect(file, timeout=SQLITE_BUSY_TIMEOUT_S)) as connection:
                connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            # switching a fresh file to WAL needs it to itself, and SQLite answers "locked" at once instead
            # of waiting: another worker is opening it right now
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise UsageError(f"cannot open storage file {path!r}: {error}") from None
            time.sleep(0.05)


def make_storage(url: str = DEFAULT_STORAGE, heartbeat_interval: int = 10,
                 grace_period: int | None = None) -> optuna.storages.RDBStorage:
    """An ``RDBStorage`` with heartbeats and stale-trial retry, tuned for concurrent workers."""
    parsed = _with_driver(parse_url(url))
    engine_kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        _prepare_sqlite(parsed.database)
        # isolation_level None: sqlite3 emits no BEGIN of its own; _begin_immediately emits ours
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S, "isolation_level": None}
    else:
        engine_kwargs["pool_pre_ping"] = True
    try:
        storage = _first_worker_safe(parsed.render_as_string(hide_password=False), engine_kwargs,
                                     heartbeat_interval, grace_period)
    except ImportError as error:  # Optuna re-raises the driver's ModuleNotFoundError as a bare ImportError
        missing = getattr(error.__cause__, "name", None) or error.name or "its database driver"
        raise UsageError(f"storage URL {url!r} needs the Python package {missing!r}: "
                         "pip install 'prism-nas[postgres]' for PostgreSQL") from None
    except sqlalchemy.exc.DBAPIError as error:  # cannot connect, no permission...
        first = str(error.orig).strip().splitlines()[0] if error.orig else str(error).splitlines()[0]
        raise UsageError(f"cannot open storage {url!r}: {first}") from None
    if parsed.get_backend_name() == "sqlite":
        sqlalchemy.event.listen(storage.engine, "begin", _begin_immediately)
    return storage


def _begin_immediately(connection: sqlalchemy.Connection) -> None:
    """Take SQLite's write lock when a transaction starts, so that what it read stays true until it commits."""
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _first_worker_safe(url: str, engine_kwargs: dict, heartbeat_interval: int,
                       grace_period: int | None) -> optuna.storages.RDBStorage:
    """Open the storage; when workers on several machines start together on a fresh database, all but one lose
    the race to create Optuna's tables ("relation ... already exists"): they retry and find the tables made."""
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            with warnings.catch_warnings():  # heartbeats and retries are "experimental" since Optuna 2.8
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return _rdb_storage(url, engine_kwargs, heartbeat_interval, grace_period)
        except sqlalchemy.exc.DBAPIError as error:
            # "relation/table ... already exists", or a unique key violated creating a type or the version row
            lost_race = isinstance(error, sqlalchemy.exc.IntegrityError) or "already exists" in str(error.orig)
            if not lost_race or attempt == CREATE_ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _rdb_storage(url: str, engine_kwargs: dict, heartbeat_interval: int,
                 grace_period: int | None) -> optuna.storages.RDBStorage:
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs=engine_kwargs,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period or 3 * heartbeat_interval,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES),
    )


def write_user_attrs(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """Set all of ``attrs`` on a running trial in one transaction: readers see all of them or none.

    Optuna's ``Trial.set_user_attr`` commits one attribute per transaction (~38 commits for a
    trained trial: ~0.2 s on SQLite, 2 % of a default CPU trial; benchmarks figure 5). On an
    ``RDBStorage`` backed by SQLite or PostgreSQL this writes one multi-row upsert into Optuna's
    own ``trial_user_attributes`` table (the statement Optuna itself issues per key, in the
    same JSON encoding), after the same "is the trial still running" check; other storages, or
    other databases, take Optuna's per-key API.
    """
    if not attrs:
        return
    storage = trial.study._storage
    backend = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a _CachedStorage
    dialect = backend.engine.name if isinstance(backend, optuna.storages.RDBStorage) else None
    if dialect not in ("sqlite", "postgresql"):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    table = models.TrialUserAttributeModel
    rows = [{"trial_id": trial._trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
    statement = insert(table).values(rows)
    statement = statement.on_conflict_do_update(index_elements=[table.trial_id, table.key],
                                                set_={"value_json": statement.excluded.value_json})
    with _create_scoped_session(backend.scoped_session) as session:
        state = models.TrialModel.find_or_raise_by_id(trial._trial_id, session).state
        backend.check_trial_is_updatable(trial._trial_id, state)
        session.execute(statement)
    trial._cached_frozen_trial.user_attrs.update(attrs)  # what Trial.set_user_attr keeps in step, per key


def unbeaten_trial_ids(study: optuna.Study, older_than_s: float) -> list[int]:
    """Trials RUNNING for more than ``older_than_s`` seconds that never recorded a heartbeat.

    Optuna's stale check (``fail_stale_trials``) skips trials without a heartbeat row, so a
    worker killed in the milliseconds between ``ask()`` and its first beat would leave a trial
    RUNNING forever, and workers waiting on it would wait forever. A live trial beats within
    milliseconds of ``ask()``, so one that is this old without a beat was abandoned. Start
    times are the asking worker's clock (Optuna's own convention), so ``older_than_s`` should
    exceed any clock skew between machines. Non-RDB storages: ``[]``.
    """
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    if not isinstance(backend, optuna.storages.RDBStorage):
        return []
    from datetime import datetime, timedelta, timezone

    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from optuna.trial import TrialState

    if hasattr(models.TrialModel, "_datetime_start_utc"):  # Optuna 5 stores naive UTC
        started, now = models.TrialModel._datetime_start_utc, datetime.now(timezone.utc).replace(tzinfo=None)
    else:  # Optuna 4: naive local time
        started, now = models.TrialModel.datetime_start, datetime.now()
    cutoff = now - timedelta(seconds=older_than_s)
    beaten = sqlalchemy.select(models.TrialHeartbeatModel.trial_id)
    query = (sqlalchemy.select(models.TrialModel.trial_id)
             .where(models.TrialModel.study_id == study._study_id)
             .where(models.TrialModel.state == TrialState.RUNNING)
             .where(started < cutoff)
             .where(models.TrialModel.trial_id.not_in(beaten)))
    with _create_scoped_session(backend.scoped_session) as session:
        return list(session.execute(query).scalars())
