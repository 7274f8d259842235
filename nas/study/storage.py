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
from nas.study import optuna_internals
from nas.study.config import DEFAULT_STORAGE, display_url

SQLITE_BUSY_TIMEOUT_S = 600
MAX_RETRIES = 3  # a shape whose worker dies this many times is left failed
CREATE_ATTEMPTS = 5  # opening a fresh database: tries while other workers race to create its tables


def parse_url(url: str) -> sqlalchemy.URL:
    """Validate a storage URL; one-line error naming it and what would be valid."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy raises ArgumentError, ValueError...
        raise UsageError(f"storage URL {display_url(url)!r} is malformed: use e.g. sqlite:///nas.db or "
                         "postgresql://user:password@host:5432/db") from None
    if parsed.get_backend_name() == "sqlite" and not parsed.database:
        raise UsageError(f"storage URL {display_url(url)!r} names no file: use e.g. sqlite:///nas.db (in-memory SQLite "
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
                 grace_period: int | None = None, read_only: bool = False) -> optuna.storages.RDBStorage:
    """An ``RDBStorage`` with heartbeats and stale-trial retry, tuned for concurrent workers.

    ``read_only`` (reports, ``nas best``): an SQLite file must exist already, and its transactions
    start with a plain ``BEGIN``: in WAL mode a reader then sees one consistent snapshot per read
    and neither waits for the search's writes nor makes them wait.
    """
    parsed = _with_driver(parse_url(url))
    engine_kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        if read_only and not Path(parsed.database).is_file():
            raise UsageError(f"storage file {parsed.database!r} does not exist: nothing has been searched there "
                             "(nas search --storage ... creates it)")
        if not read_only:  # a reader leaves the file as it is (a search has made it WAL already)
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
        raise UsageError(f"storage URL {display_url(url)!r} needs the Python package {missing!r}: "
                         "pip install 'prism-nas[postgres]' for PostgreSQL") from None
    except sqlalchemy.exc.DBAPIError as error:  # cannot connect, no permission...
        first = str(error.orig).strip().splitlines()[0] if error.orig else str(error).splitlines()[0]
        password = parsed.password
        if password:  # a driver may echo the connection string it was given
            first = first.replace(str(password), "***")
        raise UsageError(f"cannot open storage {display_url(url)!r}: {first}") from None
    if parsed.get_backend_name() == "sqlite":
        sqlalchemy.event.listen(storage.engine, "begin", _begin_deferred if read_only else _begin_immediately)
    return storage


def _begin_deferred(connection: sqlalchemy.Connection) -> None:
    """A read transaction: one snapshot of the file for everything the reader reads, no lock taken."""
    connection.exec_driver_sql("BEGIN")


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


def write_user_attrs(storage: optuna.storages.BaseStorage, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """Set all of ``attrs`` on a running trial in one transaction: readers see all of them or none.

    SQLite and PostgreSQL take one multi-row upsert (``nas.study.optuna_internals``); other
    storages Optuna's per-key ``Trial.set_user_attr``. ``trial.user_attrs`` is not updated:
    read a trial's attrs back from the study.
    """
    if attrs and not optuna_internals.write_user_attrs(storage, optuna_internals.trial_id(trial), attrs):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)


def study_kind(user_attrs: dict[str, Any]) -> str:
    """What a stored study is, from the user attrs its maker set: ``shape search`` (``nas search``: its
    ``nas:identity`` and ``nas:baseline_key``), ``re-runs of <study>`` (``nas rerun``), or ``not a shape search``
    (any other Optuna study sharing the storage: a learning-rate sweep, another tool's)."""
    if user_attrs.get("nas:rerun_of"):
        return f"re-runs of {user_attrs['nas:rerun_of']}"
    identity = user_attrs.get("nas:identity")
    if isinstance(identity, dict) and isinstance(identity.get("space"), dict) \
            and isinstance(user_attrs.get("nas:baseline_key"), str):
        return SHAPE_SEARCH
    return NOT_A_SHAPE_SEARCH


SHAPE_SEARCH, NOT_A_SHAPE_SEARCH = "shape search", "not a shape search"


def list_studies(storage: optuna.storages.BaseStorage) -> list[tuple[str, str, int]]:
    """(name, ``study_kind``, number of trials) of every study in ``storage``, in the order it holds them."""
    return [(s.study_name, study_kind(s.user_attrs), s.n_trials)
            for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def load_existing_study(url: str, study_name: str | None) -> optuna.Study:
    """An existing study, read-only (``open_existing_study``)."""
    return open_existing_study(url, study_name)[0]


def open_existing_study(url: str, study_name: str | None) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """An existing shape search and its storage, opened read-only: ``study_name``, or the storage's only one.

    ``UsageError`` naming the studies the storage holds (and which of them are shape searches) when
    ``study_name`` is missing from it, is a study that ``nas search`` did not make, or is None while the
    storage holds no shape search or several.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = make_storage(url, read_only=True)
    studies = {name: kind for name, kind, _ in list_studies(storage)}
    searches = [name for name, kind in studies.items() if kind == SHAPE_SEARCH]
    listing = ", ".join(f"{name} ({kind})" for name, kind in studies.items()) or "none"
    if study_name is None:
        if len(searches) != 1:
            raise UsageError(f"give --study-name: {display_url(url)} holds {len(searches)} shape searches; "
                             f"its studies: {listing}")
        study_name = searches[0]
    if study_name not in studies:
        raise UsageError(f"no study {study_name!r} in {display_url(url)}; its studies: {listing}")
    if studies[study_name] != SHAPE_SEARCH:
        raise UsageError(f"study {study_name!r} in {display_url(url)} is {studies[study_name]}: `nas search` did "
                         f"not make it, so it has no shapes to rank; shape searches there: "
                         f"{', '.join(searches) or 'none'} (nas studies lists them all)")
    return optuna.load_study(study_name=study_name, storage=storage), storage
