"""Whether any search on this machine is alive for an SQLite study: an advisory lock beside its file.

Every process that asks trials (a worker) holds a shared ``flock`` on ``<file>-searches`` from before its first
``ask()`` until it exits; the kernel releases it when the process dies, however it dies (SIGKILL, a full disk, an
out-of-memory kill). A search that starts takes the lock exclusively without waiting, once: if it gets it, no
worker of any search of this file is alive, so every trial still RUNNING there was left by a dead process and is
failed and re-queued at once (``nas.study.recovery.fail_orphaned``), instead of after its heartbeat's grace period
(a trial that beat) or ``ABANDONED_AFTER_S`` (one whose worker died between ``ask()`` and its first beat: 120 s).
If another search holds the lock, nothing changes: the heartbeat checks find its dead workers' trials, as they do
for a database server, which has no file to lock (``lock_path`` is None and so is every lease).

The lock is advisory and lives beside the database, so workers on other machines sharing the file over NFS take it
through NFS's own locks (Linux emulates ``flock`` there with ``fcntl`` locks). A file system that refuses the lock
file (read-only, full, no locks) leaves the search as it was before: no lease, no shortcut. Only ``nas search``'s
workers ask trials of a shape search (``nas rerun`` adds finished ones); another program asking trials of the same
study without a lease would look dead to a starting search.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nas.files import open_regular
from nas.study.storage import storage_file

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lease and no shortcut (the heartbeat checks alone)
    fcntl = None

SUFFIX = "-searches"  # beside the file's ``-wal`` and ``-shm``


def lock_path(storage_url: str) -> Path | None:
    """The lock file of an ``sqlite:///`` study (``nas.db`` -> ``nas.db-searches``) beside the file itself, its
    symbolic links followed: searches naming one database by different paths must share one lock. None for a
    database server."""
    path = storage_file(storage_url)
    if path is None:
        return None
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a loop of links (RuntimeError before Python 3.13): the file cannot be opened
        real = path
    return real.with_name(real.name + SUFFIX)


def _open(path: Path | None) -> int | None:
    """A read-only descriptor of the lock file (``flock`` needs no more), made readable by every user if this call
    creates it: a worker of another user sharing the study must hold its lease too, or a starting search would take
    its running trials for a dead search's."""
    if path is None or fcntl is None:
        return None
    try:
        created = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        created = None
    except OSError:
        return None
    if created is not None:
        os.fchmod(created, 0o644)  # whatever the umask (the owner may always)
        return created
    return open_regular(path)  # a folder, a FIFO, a device there: not ours to lock


class Lease:
    """A worker's shared hold on its study's lock file, for as long as the process that took it lives
    (``release`` or process exit); a no-op where the lock file cannot be made."""

    def __init__(self, storage_url: str) -> None:
        self._fd = _open(lock_path(storage_url))
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_SH)  # waits only while a starting search holds it exclusively
            except OSError:
                self.release()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor of the open file releases the lock
            self._fd = None


@contextmanager
def lease(storage_url: str) -> Iterator[Lease]:
    held = Lease(storage_url)
    try:
        yield held
    finally:
        held.release()


@contextmanager
def alone(storage_url: str) -> Iterator[bool]:
    """Yields True while this process holds the lock exclusively (no worker of any search of the file is alive, and
    none can start a trial until the block ends); False when another holds it, or for a database server."""
    fd = _open(lock_path(storage_url))
    if fd is None:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
