"""Paths the user names: the one place where they are expanded, checked, shown, read and written.

Every file or folder a command line names goes through here, so that every way the operating
system can refuse it (no such file, a name too long, no permission, a loop of links, a FIFO or
a device where a file was meant, a name that is not valid UTF-8) ends in one line naming the
path and what would be valid, never a traceback:

- ``show(path)``: a path as it can always be printed (``repr`` of its text, undecodable bytes as
  ``\\xNN``): what every message uses;
- ``user_path(text, what)``: ``~`` and ``~user`` expanded (an unknown user is refused);
- ``check_input(path, what, kind)``: it exists and is a regular file (or a folder);
- ``OutputFile``: a file a command writes. ``check()`` refuses, before any work, what cannot be
  written: a folder, a device or FIFO, a read-only file, a missing or unwritable folder, a name too
  long, and what writing would destroy: an SQLite database (a study's storage, under any name or
  link) and the files SQLite keeps beside one; ``write()`` writes through a temporary file beside
  the file a symbolic link names (the link stays a link) and an atomic rename (no reader ever sees
  half a file, a failed write leaves nothing behind); ``-`` is standard output.

Imports no torch.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nas.errors import UsageError, quoted

STDOUT = "-"
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
_REASONS = {errno.ENOENT: "it does not exist", errno.ENAMETOOLONG: "its name is too long for this file system",
            errno.EACCES: "permission denied", errno.EPERM: "not permitted", errno.ELOOP: "a loop of symbolic links",
            errno.ENOTDIR: "a part of it is not a folder", errno.EROFS: "a read-only file system",
            errno.ENOSPC: "no space left on device", errno.EISDIR: "it is a directory",
            errno.EPIPE: "the pipe is closed"}


def show(path: str | os.PathLike[str]) -> str:
    """``repr`` of a path's text, printable whatever bytes it holds (invalid UTF-8 as ``\\xNN``)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    return quoted(text)


def reason(error: OSError) -> str:
    """What an ``OSError`` says about a path, in words (``it does not exist``, ``permission denied``...)."""
    return _REASONS.get(error.errno or 0) or str(error.strerror or error).lower()


def kind_of(mode: int) -> str:
    """``a regular file``, ``a folder``, ``a FIFO (named pipe)``... of an ``st_mode``."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def user_path(text: str | os.PathLike[str], what: str, stored: bool = False) -> Path:
    """``text`` as a ``Path`` with ``~`` / ``~user`` expanded; ``UsageError`` for a NUL byte or an unknown user.

    ``stored``: the name is kept as text (in a study's identity, a database URL), so it must be valid UTF-8."""
    raw = os.fspath(text)
    if not raw:  # Path("") is the working directory: `--runs ""` trained into it, `-o ""` was called '.'
        raise UsageError(f"{what} is empty: give a path")
    if "\x00" in raw:
        raise UsageError(f"{what} {show(raw)} holds a NUL byte, which no file name can")
    if stored and any(0xDC80 <= ord(c) <= 0xDCFF for c in raw):
        raise UsageError(f"{what} {show(raw)} holds a byte that is not UTF-8, and the name is kept as text: rename "
                         "the file, or give a link to it with a UTF-8 name")
    if raw.startswith("~"):
        expanded = os.path.expanduser(raw)
        if expanded == raw:
            user = raw[1:].split(os.sep, 1)[0]
            raise UsageError(f"{what} {show(raw)}: there is no user {show(user)} on this machine whose home "
                             "~user could name; give the path itself")
        raw = expanded
    return Path(raw)


def stat_path(path: Path, what: str, follow: bool = True) -> os.stat_result | None:
    """The path's stat, None when it does not exist; ``UsageError`` for any other refusal."""
    try:
        return path.stat() if follow else path.lstat()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise UsageError(f"{what} {show(path)} cannot be used: {reason(error)}") from None
    except ValueError as error:  # an embedded NUL from a path built elsewhere
        raise UsageError(f"{what} {show(path)} is not a valid path: {error}") from None


def check_input(text: str | os.PathLike[str], what: str, kind: str = "file") -> Path:
    """An existing regular file (``kind="file"``), folder (``"folder"``) or either (``"any"``) to read."""
    path = user_path(text, what)
    info = stat_path(path, what)
    if info is None:
        raise UsageError(f"{what} {show(path)} does not exist")
    is_file, is_dir = stat.S_ISREG(info.st_mode), stat.S_ISDIR(info.st_mode)
    if (kind == "file" and not is_file) or (kind == "folder" and not is_dir) or (kind == "any" and not (is_file or
                                                                                                    is_dir)):
        wanted = {"file": "a regular file", "folder": "a directory", "any": "a regular file or a directory"}[kind]
        raise UsageError(f"{what} {show(path)} is {kind_of(info.st_mode)}, not {wanted}")
    return path


def read_bytes(path: Path, what: str, limit: int | None = None) -> bytes:
    """The file's bytes (its first ``limit`` bytes), or ``UsageError`` naming the path and why not."""
    try:
        with open(path, "rb") as file:
            return file.read() if limit is None else file.read(limit)
    except OSError as error:
        raise UsageError(f"cannot read {what} {show(path)}: {reason(error)}") from None


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def writable_folder(folder: Path, what: str) -> Path:
    """``folder`` exists, is a folder and this process may create files in it; else one ``UsageError``."""
    info = stat_path(folder, what)
    if info is None:
        raise UsageError(f"{what} {show(folder)} does not exist: create it first")
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {show(folder)} is {kind_of(info.st_mode)}, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what} {show(folder)} is not writable (permission denied)")
    try:  # what access() cannot tell: /proc, a file system that takes no file, a root without the right on NFS
        probe, name = tempfile.mkstemp(dir=folder, prefix=".nas-write-probe-")
    except OSError as error:
        raise UsageError(f"{what} {show(folder)} takes no new file ({error.strerror or error}): choose another "
                         "place") from None
    os.close(probe)
    os.unlink(name)
    return folder


def output_folder(text: str | os.PathLike[str], what: str) -> Path:
    """A folder a command writes into (``--out``, ``--runs``): one that exists and is writable, or one that can be
    made with its missing parents (the nearest existing parent writable); ``UsageError`` otherwise."""
    folder = user_path(text, what)
    refuse_sqlite_file(folder, f"{what} {show(folder)}")  # a folder named like SQLite's log would block the database
    info = stat_path(folder, what)
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"{what} {show(folder)} is {kind_of(info.st_mode)}: give a folder")
        return writable_folder(folder, what)
    parent = folder.absolute().parent
    while stat_path(parent, what) is None and parent != parent.parent:
        parent = parent.parent
    writable_folder(parent, f"{what} {show(folder)}: its parent folder")
    return folder


@dataclass(frozen=True)
class OutputFile:
    """A file a command writes (``-o``, ``--output``); ``-`` is standard output when ``stdout_ok``.

    ``check()`` refuses at once, before the command does its work, what could not be written; ``write()`` then
    writes through a temporary file and an atomic rename. ``force`` replaces a read-only file too.
    """

    path: Path | None  # None: standard output
    what: str
    force: bool = False

    @classmethod
    def of(cls, text: str | os.PathLike[str], what: str, stdout_ok: bool = False, force: bool = False) -> OutputFile:
        if os.fspath(text) == STDOUT:
            if not stdout_ok:
                raise UsageError(f"{what} '-' (standard output) is not possible here: give a file name")
            return cls(None, what, force)
        raw = os.fspath(text)
        last = raw.rsplit(os.sep, 1)[-1] if os.sep in raw else None
        if last in ("", ".", "..") and raw.strip(os.sep + "."):  # Path() drops a trailing / or /.: `-o dir/`
            raise UsageError(f"{what} {show(raw)} names a folder: give the name of a file to write")  # wrote "dir"
        return cls(user_path(text, what), what, force).check()

    @property
    def is_stdout(self) -> bool:
        return self.path is None

    def __str__(self) -> str:
        return "standard output" if self.path is None else str(self.path)

    def check(self) -> OutputFile:
        if self.path is None:
            return self
        path = self.path
        name = os.fsencode(path.name)
        if not name or path.name in (".", ".."):
            raise UsageError(f"{self.what} {show(path)} is a directory: give a file name")
        if len(name) + len(".tmp") + 9 > _name_max(path.parent if str(path.parent) else Path(".")):
            raise UsageError(f"{self.what} {show(path)} has a name too long for this file system "
                             f"({len(name)} bytes)")
        info = stat_path(path, self.what)
        if info is not None:
            if not stat.S_ISREG(info.st_mode):
                raise UsageError(f"{self.what} {show(path)} is {kind_of(info.st_mode)}: give the name of a file "
                                 "to write")
            if not self.force and (not info.st_mode & 0o222 or not os.access(path, os.W_OK)):
                raise UsageError(f"{self.what} {show(path)} is read-only (mode {stat.S_IMODE(info.st_mode):04o}): "
                                 "make it writable or choose another name")
        target = self.target
        refuse_sqlite_file(target, f"{self.what} {show(path)}")
        writable_folder(target.parent, f"{self.what} {show(path)}: its folder")
        return self

    def check_apart(self, inputs: list[tuple[str, Path]]) -> OutputFile:
        """Refuse an output that is one of the command's inputs (``(flag, path)``: a file, or a folder it reads every
        file of) or lies inside such a folder: ``nas train --data corpus.txt -o corpus.txt`` replaced the training
        data by the result, and a result written into a folder of shards or texts is read with them next time."""
        if self.path is not None:
            refuse_inside(self.target, f"{self.what} {show(self.path)}", inputs)
        return self

    @property
    def target(self) -> Path:
        """The file written: the path itself, or the file its symbolic links name (replacing the link by a file
        would leave the file it names as it was, and a link such as ``/dev/stdout`` broken for every program)."""
        assert self.path is not None
        return Path(os.path.realpath(self.path)) if self.path.is_symlink() else self.path

    def write(self, content: str | bytes) -> None:
        """Write all of ``content``; a failure is one ``UsageError`` and leaves no temporary file behind."""
        data = content.encode("utf-8") if isinstance(content, str) else content
        if self.path is None:
            write_stdout(data)
            return
        self.check()
        target = self.target
        existing = target.exists()
        mode = stat.S_IMODE(target.stat().st_mode) | (0o200 if self.force else 0) if existing \
            else 0o666 & ~_umask()
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, target)
            tmp = None
        except OSError as error:
            raise UsageError(f"cannot write {self.what} {show(self.path)}: {reason(error)}") from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database (sqlite.org/fileformat.html)
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal", "-searches")  # SQLite's log, index and journal; the search lock
COMPANION_ROLES = {"-wal": "the name SQLite gives the write-ahead log of {db} (its newest trials, until SQLite copies "
                           "them in)",
                   "-shm": "the name SQLite gives the index of the write-ahead log of {db}",
                   "-journal": "the name SQLite gives the rollback journal of {db}",
                   "-searches": "the name `nas search` gives the lock it keeps beside {db}"}


def companion_of(path: Path) -> tuple[str, Path] | None:
    """``(suffix, database)`` when ``path`` is named as a file SQLite (or ``nas search``) keeps beside ``database``
    (``nas.db-wal`` beside ``nas.db``), by its name alone; None otherwise."""
    suffix = next((s for s in SQLITE_COMPANIONS if path.name.endswith(s) and path.name != s), None)
    return None if suffix is None else (suffix, path.with_name(path.name.removesuffix(suffix)))


def refuse_inside(path: Path, what: str, inputs: list[tuple[str, Path]]) -> None:
    """``UsageError`` when writing ``path`` (a file or a folder) would replace one of ``inputs`` (``(flag, path)``:
    a file, or a folder whose files are read) or add to what such a folder holds."""
    target = Path(os.path.realpath(path))
    for flag, source in inputs:
        real = Path(os.path.realpath(source))
        if target == real or (target.exists() and real.exists() and os.path.samefile(target, real)):
            raise UsageError(f"{what} is the {flag} this command reads: writing over it would lose it; choose "
                             "another name")
        if real.is_dir() and real in target.parents:
            raise UsageError(f"{what} lies in the {flag} folder {show(source)}, whose files are the data: the next "
                             "run would read it too; choose a place outside it")


def open_regular(path: Path) -> int | None:
    """A read-only, close-on-exec descriptor of ``path`` when it is a regular file; None otherwise (missing, a folder,
    a FIFO, a device, unreadable). Its kind is looked at before the open (opening a FIFO to read waits for a writer,
    a device's open may act on it) and again after (a swap meanwhile; the open does not block)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def is_sqlite_database(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts as an SQLite database does (False when it cannot be read).

    It opens the file itself, so call it before this process opens the database through SQLite: closing any other
    descriptor of a database file releases the locks SQLite holds on it (``nas.study.sqlite_file``). The commands
    check their outputs before they read the study."""
    fd = open_regular(path)
    if fd is None:
        return False
    with os.fdopen(fd, "rb") as file:
        try:
            return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER
        except OSError:
            return False


def refuse_sqlite_file(path: Path, what: str) -> None:
    """``UsageError`` when writing ``path`` would destroy a database: an SQLite file (a study's storage, whatever
    its name), or a file SQLite keeps beside one (its write-ahead log holds the newest trials until SQLite copies
    them into the file)."""
    if is_sqlite_database(path):
        raise UsageError(f"{what} is an SQLite database (a study's storage?): writing over it would lose what it "
                         "holds; choose another name")
    companion = companion_of(path)
    if companion is not None and is_sqlite_database(database := companion[1]):
        suffix = companion[0]
        raise UsageError(f"{what} is the {suffix} file of the SQLite database {show(database)}: writing over it "
                         "could lose what the database holds; choose another name")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_stdout(data: bytes | str) -> None:
    """Write to standard output and flush; a closed or full output is one ``OutputClosed`` error."""
    stream = sys.stdout
    if stream is None:
        raise OutputClosed("standard output is closed")
    try:
        if isinstance(data, bytes):
            buffer = getattr(stream, "buffer", None)
            if buffer is not None:
                stream.flush()
                buffer.write(data)
                buffer.flush()
                return
            data = data.decode("utf-8")
        stream.write(data)
        stream.flush()
    except OSError as error:
        raise OutputClosed.of(error) from None


class OutputClosed(RuntimeError):
    """Standard output is closed or full (``nas best > /dev/full``): one line, exit code 1. A reader that closed
    its pipe early (``nas space list | head -1``) is ``quiet``: it asked for no more, so nothing is said."""

    def __init__(self, message: str, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet

    @classmethod
    def of(cls, error: OSError) -> OutputClosed:
        return cls(f"cannot write to standard output: {reason(error)}", quiet=error.errno == errno.EPIPE)
