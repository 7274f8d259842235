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
import math
import os
import re
import sqlite3
import time
import urllib.parse
import warnings
from contextlib import closing
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from sqlalchemy.engine import make_url

from nas.errors import UsageError
from nas.files import COMPANION_ROLES, companion_of, show, user_path, writable_folder
from nas.study import optuna_internals
from nas.study.config import DEFAULT_STORAGE, display_url
from nas.study.signals import quiet_stops
from nas.study.sqlite_file import (
    OPTUNA_TABLES,
    SqliteFile,
    close_with_readers,
    inspect_sqlite,
    is_database,
    read_only_connect,
)

SQLITE_BUSY_TIMEOUT_S = 600
MAX_RETRIES = 3  # a shape whose worker dies this many times is left failed
CREATE_ATTEMPTS = 5  # opening a fresh database: tries while other workers race to create its tables


SQLITE_QUERY = ("timeout",)  # what a sqlite:/// URL may carry after "?": the busy timeout in seconds


class EmptyStorage(UsageError):
    """A reader was pointed at a storage with no Optuna tables yet: it holds no study (and is left as it is)."""


def parse_url(url: str) -> sqlalchemy.URL:
    """Validate a storage URL; one-line error naming it and what would be valid."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - sqlalchemy raises ArgumentError, ValueError...
        raise UsageError(f"storage URL {display_url(url)!r} is malformed: use e.g. sqlite:///nas.db or "
                         "postgresql://user:password@host:5432/db") from None
    try:
        parsed.get_dialect()  # file:///, http://...: no database SQLAlchemy knows
    except Exception:  # noqa: BLE001 - NoSuchModuleError, or a dialect's own import failing
        raise UsageError(f"storage URL {display_url(url)!r} is not a database URL SQLAlchemy knows: use e.g. "
                         "sqlite:///nas.db or postgresql://user:password@host:5432/db") from None
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
            raise UsageError(f"storage URL {display_url(url)!r} names no file: use e.g. sqlite:///nas.db (in-memory "
                             "SQLite cannot be shared between workers)")
        unknown = sorted(set(parsed.query) - set(SQLITE_QUERY))
        if unknown:
            raise UsageError(f"storage URL {display_url(url)!r} has the option(s) {', '.join(unknown)}, which a "
                             "sqlite:/// storage does not take (only ?timeout=SECONDS)")
        if "timeout" in parsed.query:
            _sqlite_timeout(parsed, url)
    return parsed


def storage_file(url: str) -> Path | None:
    """The file an ``sqlite:///`` storage lives in (absolute; its ``-wal`` and ``-shm`` files lie beside it), None for
    a database server; ``UsageError`` for a URL ``parse_url`` refuses."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return user_path(parsed.database, "storage file", stored=True).absolute()


def _sqlite_timeout(parsed: sqlalchemy.URL, url: str) -> float:
    """The URL's ``?timeout=`` (seconds SQLite waits for the write lock), else ``SQLITE_BUSY_TIMEOUT_S``."""
    value = parsed.query.get("timeout")
    if value is None:
        return SQLITE_BUSY_TIMEOUT_S
    text = value if isinstance(value, str) else value[-1]
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0 or seconds > 10**6:
        raise UsageError(f"storage URL {display_url(url)!r}: timeout={text!r} is invalid: give the seconds SQLite "
                         "waits for the write lock, e.g. ?timeout=600")
    return seconds


def _with_driver(parsed: sqlalchemy.URL) -> sqlalchemy.URL:
    """``postgresql://`` names no driver and SQLAlchemy 2.1 defaults it to psycopg 3; use the one installed."""
    if parsed.drivername != "postgresql":
        return parsed
    for module in ("psycopg2", "psycopg"):  # psycopg2 first: the ``postgres`` extra installs it
        if importlib.util.find_spec(module) is not None:
            return parsed.set(drivername=f"postgresql+{module}")
    return parsed


def _prepare_sqlite(path: str, timeout: float) -> None:
    """Switch the file to WAL journaling (a persistent property of the file)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with closing(sqlite3.connect(path, timeout=timeout)) as connection:
                connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            # switching a fresh file to WAL needs it to itself, and SQLite answers "locked" at once instead
            # of waiting: another worker is opening it right now
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise UsageError(f"cannot open storage file {show(path)}: {error}") from None
            time.sleep(0.05)
        except sqlite3.DatabaseError as error:  # not a database, damaged
            raise UsageError(f"storage file {show(path)} is not a usable SQLite database: {error}") from None


def refuse_companion(path: Path) -> None:
    """``UsageError`` when ``path`` names a file SQLite or a search keeps beside an SQLite database: opened as a
    database, a search wrote a new study into the write-ahead log of a study another search was writing (SQLite
    then finds a log that is not its own); a reader was told the file "holds no study yet". The database is asked
    through SQLite (``is_database``): a descriptor of this process's own, once closed, would release this process's
    SQLite locks on it (``nas.study.sqlite_file``)."""
    companion = companion_of(path)
    if companion is not None and is_database(companion[1]):
        suffix, database = companion
        role = COMPANION_ROLES[suffix].format(db=show(database))
        raise UsageError(f"storage file {show(path)} is {role}, not a study: a database there would be lost, or damage "
                         f"{show(database)}; give --storage sqlite:///{database} for that study, or another name")


def _check_sqlite(url: str, path: Path, read_only: bool) -> SqliteFile:
    """What the SQLite file holds, refusing what neither a search nor a reader may open (``nas.study.sqlite_file``)."""
    what = "storage file"
    refuse_companion(path)
    if read_only:
        found = inspect_sqlite(path, what)
        if not found.exists:
            raise UsageError(f"storage file {show(path)} does not exist: nothing has been searched there "
                             "(nas search --storage ... creates it)")
    else:
        writable_folder(path.parent if str(path.parent) else Path("."), f"storage {display_url(url)!r}: its folder")
        found = inspect_sqlite(path, what)
    if found.empty:
        if read_only:
            raise EmptyStorage(f"{display_url(url)} holds no study yet (an empty database)")
        return found
    if found.is_unfinished_optuna(optuna.__version__, optuna_internals.table_names()):
        if read_only:
            raise EmptyStorage(f"{display_url(url)} holds no study yet (its creation was interrupted; "
                               "`nas search` completes it)")
        return found
    if not found.is_optuna:
        raise UsageError(f"storage file {show(path)} {found.describe_foreign()}: give the file `nas search` made, or "
                         "a new name")
    head, known = optuna_internals.schema_revisions()
    if found.schema_revision != head:
        made = f"it was made by Optuna {found.optuna_version or '(unknown version)'}"
        if found.schema_revision not in known:
            raise UsageError(f"cannot open storage {display_url(url)!r}: {made}, newer than this Optuna "
                             f"{optuna.__version__}: {newer_optuna_advice(found.optuna_version)}")
        raise UsageError(f"cannot open storage {display_url(url)!r}: {made}, whose tables are older than this Optuna "
                         f"{optuna.__version__} reads: back the file up, then `optuna storage upgrade --storage URL`")
    return found


def check_writable(url: str) -> None:
    """``UsageError`` in one line when an SQLite storage cannot be written (its folder or its file is read-only),
    checked before a command that records into it writes anything; another database is checked when it connects."""
    parsed = _with_driver(parse_url(url))
    if parsed.get_backend_name() != "sqlite":
        return
    path = user_path(parsed.database, "storage file", stored=True)
    refuse_companion(path)
    writable_folder(path.parent if str(path.parent) else Path("."), f"storage {display_url(url)!r}: its folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"storage file {show(path)} is read-only: this command records its runs there")


def make_storage(url: str = DEFAULT_STORAGE, heartbeat_interval: int = 10,
                 grace_period: int | None = None, read_only: bool = False) -> optuna.storages.RDBStorage:
    """An ``RDBStorage`` with heartbeats and stale-trial retry, tuned for concurrent workers.

    The one place a storage is opened. SQLite: the file is inspected first (``nas.study.sqlite_file``): a
    text file, a damaged database, another program's database or a folder that is missing are refused in
    one line, and a database that another Optuna made is refused naming its version.

    ``read_only`` (``nas studies``, ``best``, ``report``, ``export``): the file must be an Optuna storage
    already (``EmptyStorage`` when it holds no table), no table is created or migrated, and an SQLite file
    is opened through read-only connections (``mode=ro``, or ``immutable=1`` in a read-only folder), so a
    reader cannot write it; its transactions start with a plain ``BEGIN``: in WAL mode a reader then sees
    one consistent snapshot per read and neither waits for the search's writes nor makes them wait.
    """
    parsed = _with_driver(parse_url(url))
    engine_kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        path = user_path(parsed.database, "storage file", stored=True)
        timeout = _sqlite_timeout(parsed, url)
        found = _check_sqlite(url, path, read_only)
        parsed = parsed.set(database=str(path), query={})
        if read_only:
            engine_kwargs["creator"] = read_only_connect(path, found.immutable, timeout)
        else:
            _prepare_sqlite(str(path), timeout)
            # isolation_level None: sqlite3 emits no BEGIN of its own; _begin_immediately emits ours
            engine_kwargs["connect_args"] = {"timeout": timeout, "isolation_level": None}
    else:
        engine_kwargs["pool_pre_ping"] = True
    try:
        storage = _first_worker_safe(parsed.render_as_string(hide_password=False), engine_kwargs,
                                     heartbeat_interval, grace_period, read_only)
    except ImportError as error:  # Optuna re-raises the driver's ModuleNotFoundError as a bare ImportError
        missing = getattr(error.__cause__, "name", None) or error.name or "its database driver"
        if parsed.get_backend_name() != "postgresql":
            install = "install that driver (prism-nas is tested with SQLite and PostgreSQL)"
        elif parsed.get_driver_name() == "psycopg2":
            install = "pip install 'prism-nas[postgres]'"
        else:  # the extra installs psycopg2, which another driver's URL does not use
            install = ("install it, or write the URL as postgresql://... (the driver psycopg2, which pip install "
                       "'prism-nas[postgres]' installs; prism-nas is tested with it)")
        raise UsageError(f"storage URL {display_url(url)!r} needs the Python package {missing!r}: {install}") from None
    except sqlalchemy.exc.DBAPIError as error:  # cannot connect, no permission...
        first = str(error.orig).strip().splitlines()[0] if error.orig else str(error).splitlines()[0]
        raise UsageError(f"cannot open storage {display_url(url)!r}: {without_password(first, parsed.password)}") \
            from None
    except RuntimeError as error:  # Optuna's schema check: another Optuna version made this storage
        raise UsageError(f"cannot open storage {display_url(url)!r}: {_schema_message(str(error))}") from None
    if parsed.get_backend_name() == "sqlite":
        sqlalchemy.event.listen(storage.engine, "begin", _begin_deferred if read_only else _begin_immediately)
        if read_only:  # its connections close before the side files they made are removed (nas.study.sqlite_file)
            close_with_readers(storage.engine)
    return storage


def without_password(text: str, password: object) -> str:
    """``text`` with ``password`` (as given, and URL-quoted) masked wherever it stands as a whole value: a driver may
    echo the connection string it was given. Masking every occurrence of its characters garbled the message (a
    password 'e' printed 'conn***ction to s***rv***r')."""
    if not password:
        return text
    for form in dict.fromkeys((str(password), urllib.parse.quote(str(password), safe=""))):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(form)}(?![A-Za-z0-9])", "***", text)
    return text


def newer_optuna_advice(made_by: str | None) -> str:
    """What reads a storage a newer Optuna made: the newest 5.x (prism-nas's pin) where that Optuna was a 5.x, else
    nothing this prism-nas installs."""
    major = re.match(r"(\d+)\.", made_by or "")
    ours = optuna.__version__.split(".")[0]
    if major and major.group(1) != ours:
        return (f"prism-nas runs on Optuna {ours}.x, which cannot read it: open it with the Optuna that made it, or "
                "give another storage")
    return "pip install -U 'optuna<6' to read it"


def _schema_message(message: str) -> str:
    """Optuna's schema-compatibility error as one line that says which Optuna made the storage and what to do."""
    made = re.search(r"set up by optuna ([^)\s]+)", message)
    by = f"it was made by Optuna {made.group(1)}" if made else "another Optuna version made it"
    if "pip install -U optuna" in message:
        return f"{by}, newer than this Optuna {optuna.__version__}: " \
               f"{newer_optuna_advice(made.group(1) if made else None)}"
    if "storage upgrade" in message:
        return (f"{by}, whose tables are older than this Optuna {optuna.__version__} reads: back the file up, then "
                "`optuna storage upgrade --storage URL`")
    return " ".join(message.split())


def _begin_deferred(connection: sqlalchemy.Connection) -> None:
    """A read transaction: one snapshot of the file for everything the reader reads, no lock taken."""
    connection.exec_driver_sql("BEGIN")


def _begin_immediately(connection: sqlalchemy.Connection) -> None:
    """Take SQLite's write lock when a transaction starts, so that what it read stays true until it commits."""
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _first_worker_safe(url: str, engine_kwargs: dict, heartbeat_interval: int,
                       grace_period: int | None, read_only: bool = False) -> optuna.storages.RDBStorage:
    """Open the storage; when workers on several machines start together on a fresh database, all but one lose
    the race to create Optuna's tables ("relation ... already exists"): they retry and find the tables made."""
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            with warnings.catch_warnings():  # heartbeats and retries are "experimental" since Optuna 2.8
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return _rdb_storage(url, engine_kwargs, heartbeat_interval, grace_period, read_only)
        except sqlalchemy.exc.DBAPIError as error:
            # "relation/table ... already exists", or a unique key violated creating a type or the version row
            lost_race = isinstance(error, sqlalchemy.exc.IntegrityError) or "already exists" in str(error.orig)
            if not lost_race or attempt == CREATE_ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _rdb_storage(url: str, engine_kwargs: dict, heartbeat_interval: int,
                 grace_period: int | None, read_only: bool = False) -> optuna.storages.RDBStorage:
    quiet_stops()  # a stop inside SQLAlchemy's pool is the command's one line, not a logged traceback
    if read_only and not url.startswith("sqlite"):
        _check_tables(url, engine_kwargs)
    return optuna.storages.RDBStorage(
        url,
        engine_kwargs=engine_kwargs,
        skip_table_creation=read_only,
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period or 3 * heartbeat_interval,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES),
    )


def _check_tables(url: str, engine_kwargs: dict) -> None:
    """A server database a reader opens must hold Optuna's tables already (``EmptyStorage`` or ``UsageError``)."""
    engine = sqlalchemy.create_engine(url, **engine_kwargs)
    try:
        tables = set(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    if not tables:
        raise EmptyStorage(f"{display_url(url)} holds no study yet (an empty database)")
    missing = sorted(OPTUNA_TABLES - tables)
    if missing:
        raise UsageError(f"storage {display_url(url)!r} is not an Optuna storage: it lacks the tables "
                         f"{', '.join(missing)}")


def write_user_attrs(storage: optuna.storages.BaseStorage, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """Set all of ``attrs`` on a running trial in one transaction: readers see all of them or none.

    SQLite and PostgreSQL take one multi-row upsert (``nas.study.optuna_internals``); other
    storages Optuna's per-key ``Trial.set_user_attr``. ``trial.user_attrs`` is not updated:
    read a trial's attrs back from the study.
    """
    if attrs and not optuna_internals.write_user_attrs(storage, optuna_internals.trial_id(trial), attrs):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
