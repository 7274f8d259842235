"""What an SQLite storage file holds, read without changing it: before Optuna opens it, and for readers instead.

``inspect_sqlite`` looks at a file named by a ``sqlite:///`` URL through a read-only connection
(``mode=ro``; ``immutable=1`` when the folder cannot hold SQLite's ``-shm`` file, as a write-ahead-log
database in a read-only folder needs) and says what it is: missing, empty, another program's
database, an Optuna storage (with the Optuna version and schema revision that made it), or not a
database at all (a text file, a damaged or truncated one). ``make_storage`` refuses each of the
last in one line, and opens a reader's storage through ``read_only_connect`` so that a command that
only reads can never write the file.

A reader of a write-ahead-log database makes SQLite's ``-wal`` and ``-shm`` files beside it (its shared
memory index), and, being read-only, cannot remove them as a writer's last close does. ``release_readers``
(called as every command ends, and at exit) closes this process's readers and removes the pair where they
made it, the way SQLite does: a read-write connection that only reads, whose close, when it is the file's
last, finds the log empty, checkpoints nothing and deletes both; the database's bytes do not change, and
while any other process has the file open (a search) SQLite deletes nothing.
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import stat
import urllib.parse
import weakref
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nas.errors import UsageError
from nas.files import kind_of, reason, show

OPTUNA_TABLES = frozenset({"studies", "trials", "version_info", "alembic_version"})


@dataclass(frozen=True)
class SqliteFile:
    """A storage file as found: ``exists``, its ``tables``, and what Optuna wrote in it."""

    path: Path
    exists: bool
    tables: frozenset[str] = frozenset()
    optuna_version: str | None = None  # version_info.library_version: the Optuna that created it
    schema_revision: str | None = None  # alembic_version.version_num
    immutable: bool = False  # read through immutable=1 (a WAL file in a folder this process cannot write)
    studies: int = 0  # rows in the studies table (0 when it has none)

    @property
    def empty(self) -> bool:
        """No table at all: a new (or zero-byte) file, which a search may fill and a reader finds no study in."""
        return not self.tables

    @property
    def is_optuna(self) -> bool:
        return OPTUNA_TABLES <= self.tables

    def is_unfinished_optuna(self, this_optuna: str, optuna_tables: frozenset[str]) -> bool:
        """Some of ``optuna_tables`` (every table this Optuna makes) and nothing else, no schema revision, no study,
        and (when it says) made by ``this_optuna``: a storage whose creation was killed part-way (a search killed at
        its first moment). Optuna's own start completes it (``create_all`` makes the missing tables, then stamps
        the revision)."""
        return (bool(self.tables) and self.tables <= optuna_tables and self.schema_revision is None
                and self.studies == 0 and self.optuna_version in (None, this_optuna))

    def describe_foreign(self) -> str:
        """``holds the tables a, b, c of another program`` (at most 6 named)."""
        names = sorted(self.tables)
        listed = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        missing = sorted(OPTUNA_TABLES - self.tables)
        return (f"is an SQLite database but not an Optuna storage (its tables: {listed}; "
                f"missing Optuna's {', '.join(missing)})")


def _uri(path: Path, immutable: bool, mode: str = "ro") -> str:
    query = "immutable=1" if immutable else f"mode={mode}"
    return f"file:{urllib.parse.quote(str(path.absolute()))}?{query}"


class Disposable(Protocol):
    """A reader's connection pool (SQLAlchemy's ``Engine``)."""

    def dispose(self) -> None:
        """Close its connections."""


# database files whose -wal and -shm this process's readers made; what closes this process's readers
_MADE_BY_READERS: set[Path] = set()
_READERS: list[weakref.ref[Disposable]] = []  # weak: a library user's many readers are not kept alive


def side_files(path: Path) -> tuple[Path, Path]:
    """SQLite's write-ahead log and its shared-memory index beside ``path``: (``path-wal``, ``path-shm``)."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def note_reader(path: Path, immutable: bool) -> None:
    """Before this process reads ``path`` (``immutable=1`` makes no file): if neither side file is there, the readers
    will have made them, and ``release_readers`` removes them. SQLite puts them beside the file a symbolic link
    names, so they are looked for there."""
    real = path.resolve()
    if not immutable and not any(side.exists() for side in side_files(real)):
        _MADE_BY_READERS.add(real)


def close_with_readers(pool: Disposable) -> None:
    """A reader's connection pool, closed as ``release_readers`` starts (if it is still alive; one that was collected
    closed its connections then)."""
    _READERS[:] = [*(alive for alive in _READERS if alive() is not None), weakref.ref(pool)]


def release_readers() -> None:
    """Close this process's readers, then remove the side files they made (module docstring)."""
    while _READERS:
        pool = _READERS.pop()()
        if pool is not None:
            pool.dispose()
    while _MADE_BY_READERS:
        remove_empty_log(_MADE_BY_READERS.pop())


def remove_empty_log(path: Path) -> None:
    """Remove ``path``'s ``-wal`` and ``-shm`` when the log holds no frame and no other connection has the file open:
    a read-write connection reads the schema cookie and closes; as the file's last connection SQLite checkpoints
    the empty log (nothing reaches the database) and deletes both. A log with frames (a writer's) is left to its
    writers; a file this process may not write, or one busy past a second, is left as it is."""
    wal = side_files(path)[0]
    try:
        if wal.stat().st_size:
            return
        connection = sqlite3.connect(_uri(path, False, "rw"), uri=True, timeout=1.0)
    except (OSError, ValueError, sqlite3.Error):  # gone, unreadable, a name a URI cannot hold (not UTF-8)
        return
    with closing(connection), suppress(sqlite3.Error):
        connection.execute("PRAGMA schema_version").fetchone()  # opens the log: its close is the one that cleans up


atexit.register(release_readers)  # a library user's readers too (commands release theirs as they end)


def read_only_connect(path: Path, immutable: bool, timeout: float) -> Callable[[], sqlite3.Connection]:
    """A connection factory that opens ``path`` read-only (SQLAlchemy's ``creator``): it can never write it."""

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(_uri(path, immutable), uri=True, timeout=timeout, isolation_level=None,
                               check_same_thread=False)

    return connect


def inspect_sqlite(path: Path, what: str) -> SqliteFile:
    """What ``path`` holds (module docstring); ``UsageError`` when it is no SQLite database or cannot be read."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return SqliteFile(path, exists=False)
    except OSError as error:
        raise UsageError(f"{what} {show(path)} cannot be used: {reason(error)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{what} {show(path)} is {kind_of(info.st_mode)}, not an SQLite database file")
    if info.st_size == 0:
        return SqliteFile(path, exists=True)
    # The file is read through SQLite only, never opened by this process otherwise: closing any other descriptor of
    # a database file releases every POSIX lock the process holds on it, and a search's writers then corrupt it
    # ("How To Corrupt An SQLite Database File", sqlite.org, 2.2). A header that is not SQLite's is SQLite's
    # "file is not a database".
    immutable = not os.access(path.parent if str(path.parent) else Path("."), os.W_OK | os.X_OK)
    note_reader(path, immutable)
    try:
        return _read_tables(path, immutable)
    except sqlite3.OperationalError as error:
        if immutable or "readonly" not in str(error) and "unable to open" not in str(error):
            raise UsageError(f"{what} {show(path)} cannot be read: {error}") from None
        return _read_tables(path, True)
    except sqlite3.DatabaseError as error:
        if "not a database" in str(error):
            raise UsageError(f"{what} {show(path)} is not an SQLite database ({error}): give the file `nas search` "
                             "made, or a new name") from None
        raise UsageError(f"{what} {show(path)} is damaged ({error}): restore it from a copy, or recover what it "
                         "holds with `sqlite3 FILE .recover`") from None


def study_names(path: Path) -> frozenset[str] | None:
    """The names of the studies in the Optuna storage ``path`` (none in an empty file, or one whose creation was
    stopped), read through a read-only connection; None when it cannot be read as one (missing, damaged, another
    program's: opening it says which)."""
    try:
        found = inspect_sqlite(path, "storage file")
        if "studies" not in found.tables:  # empty, or its creation was stopped before the table: no study yet
            return frozenset() if found.exists and not found.tables - OPTUNA_TABLES else None
        with closing(sqlite3.connect(_uri(path, found.immutable), uri=True, timeout=30)) as connection:
            return frozenset(name for (name,) in connection.execute("SELECT study_name FROM studies"))
    except (UsageError, sqlite3.Error, ValueError):
        return None


def is_database(path: Path) -> bool:
    """Whether SQLite reads ``path`` as a database (an empty file counts: SQLite makes one of it), asked through
    SQLite: a descriptor of this process's own, once closed, would release the locks SQLite holds on the file."""
    try:
        inspect_sqlite(path, "storage file")
    except UsageError:
        return False
    return path.is_file()


def _read_tables(path: Path, immutable: bool) -> SqliteFile:
    connection = sqlite3.connect(_uri(path, immutable), uri=True, timeout=30)
    try:
        tables = frozenset(name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        check = connection.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        version = revision = None
        studies = 0
        if "studies" in tables:
            studies = connection.execute("SELECT count(*) FROM studies").fetchone()[0]
        if "version_info" in tables:
            row = connection.execute("SELECT library_version FROM version_info LIMIT 1").fetchone()
            version = row[0] if row else None
        if "alembic_version" in tables:
            row = connection.execute("SELECT version_num FROM alembic_version LIMIT 1").fetchone()
            revision = row[0] if row else None
        return SqliteFile(path, True, tables, version, revision, immutable, studies)
    finally:
        connection.close()
