"""Which files a data source names: a folder walked, a glob expanded, each real file once.

Neither follows a linked folder (a link back up the tree would repeat every file under it without end), and a
file reached twice (a link to a file already listed) is kept once, so no file is read twice nor lands in both
splits. ``nas.data.sources`` reads what these list.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from nas.data.cache import Stamp, file_stamp, stamp_of
from nas.errors import UsageError
from nas.files import reason, show

FileEntry = tuple[str, str, Stamp]  # relative posix path, path to open, (size, mtime_ns, ctime_ns)


def walk_files(root: str, skip_dir: Callable[[str], bool], keep_file: Callable[[str], bool]) -> list[FileEntry]:
    """Regular files under ``root`` (symlinked directories not followed), sorted by relative path.

    ``os.scandir`` rather than ``os.walk`` + ``pathlib``: its entries carry the stat, which keeps
    a cached load of the builtin corpus (734 files to stat for the key) well under 50 ms.
    """
    found: list[FileEntry] = []
    stack = [("", root)]
    while stack:
        rel_dir, directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise UsageError(f"cannot read folder {show(directory)}: {reason(exc)}") from None
        for entry in entries:
            rel = rel_dir + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not skip_dir(entry.name):
                        stack.append((rel + "/", entry.path))
                elif keep_file(entry.name) and entry.is_file():
                    st = entry.stat()
                    found.append((rel, entry.path, stamp_of(st), (st.st_dev, st.st_ino)))
            except OSError:  # a link to nowhere, a loop of links: no file to read
                continue
    return once_each(found)


def once_each(found: list[tuple[str, str, Stamp, tuple[int, int]]]) -> list[FileEntry]:
    """Sorted by relative path, each real file once (a link to a file already listed is dropped, so a file is never
    read twice nor lands in both splits)."""
    seen: set[tuple[int, int]] = set()
    kept = []
    for rel, path, stamp, identity in sorted(found):
        if identity not in seen:
            seen.add(identity)
            kept.append((rel, path, stamp))
    return kept


def skipped_folder(name: str) -> bool:
    """A folder ``list_directory`` does not enter: hidden, or ``__pycache__``."""
    return name.startswith(".") or name == "__pycache__"


def list_directory(root: Path) -> list[FileEntry]:
    """Files under ``root``, recursively, skipping hidden files and directories and ``__pycache__``."""
    return walk_files(str(root), skipped_folder, lambda f: not f.startswith("."))


def list_paths(paths: list[Path], base: Path) -> list[FileEntry]:
    """Explicit files (one file, a glob's matches) named relative to ``base``."""
    return [(p.name if p == base else p.relative_to(base).as_posix(), str(p), file_stamp(p)) for p in paths]


def expand_glob(pattern: str) -> list[Path]:
    """The regular files ``pattern`` matches, each real file once, in path order.

    ``*``, ``?`` and ``[...]`` match within one path part (not a leading dot, as the shell's glob), ``**`` any
    number of folders. Unlike ``glob.glob``, ``**`` does not descend into linked folders: a link that points back
    up the tree would repeat every file under it without end (and glob reads each file once per lap)."""
    parts = pattern.split(os.sep)
    if parts[0] == "":  # an absolute pattern
        start, parts = os.sep, parts[1:]
    else:
        start = os.curdir
    found: list[tuple[str, str, Stamp, tuple[int, int]]] = []
    for path in _glob_in(start, [p for p in parts if p not in ("", os.curdir)], top=start == os.curdir):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((path, path, stamp_of(st), (st.st_dev, st.st_ino)))
    return [Path(path) for _, path, _ in once_each(found)]


def _glob_in(directory: str, parts: list[str], top: bool = False) -> Iterator[str]:
    """Paths under ``directory`` matching ``parts`` (``expand_glob``); ``top``: paths relative to the working folder."""

    def join(name: str) -> str:
        return name if top else os.path.join(directory, name)

    head, rest = parts[0], parts[1:]
    if head == "**":
        if rest:
            yield from _glob_in(directory, rest, top)
        for entry in _entries(directory):
            if entry.name.startswith("."):
                continue
            if not rest:
                yield join(entry.name)
            if entry.is_dir(follow_symlinks=False):
                yield from _glob_in(join(entry.name), parts)
    elif glob.has_magic(head):
        for entry in _entries(directory):
            if entry.name.startswith(".") and not head.startswith("."):
                continue
            if fnmatch.fnmatchcase(entry.name, head):
                if not rest:
                    yield join(entry.name)
                elif _is_dir(entry):
                    yield from _glob_in(join(entry.name), rest)
    else:
        path = join(head)
        if not rest:
            yield path
        elif os.path.isdir(path):
            yield from _glob_in(path, rest)


def _entries(directory: str) -> list[os.DirEntry[str]]:
    """The folder's entries; none of a folder gone meanwhile. A folder the pattern reaches but cannot read is refused,
    as a folder walk refuses one: ``glob.glob`` skips it without a word, and its files would be left out of the data."""
    try:
        return list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise UsageError(f"cannot read folder {show(directory)}: {reason(exc)}") from None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def walks_into(folder: Path, inner: Path) -> bool:
    """Whether ``list_directory(folder)`` reads the files of ``inner`` (both resolved): it lies under ``folder`` with no
    hidden folder, ``__pycache__`` or link on the way (the walk skips those)."""
    if inner != folder and folder not in inner.parents:
        return False
    step = folder
    for part in inner.relative_to(folder).parts:
        step = step / part
        if skipped_folder(part) or step.is_symlink():
            return False
    return True


def glob_matches(pattern: str, path: Path) -> bool:
    """Whether ``expand_glob(pattern)`` would match ``path`` once it exists (the storage a search is about to make):
    ``*``, ``?`` and ``[...]`` within a part, never a leading dot unless the pattern's part starts with one, ``**``
    any number of folders; a relative pattern from the working directory."""
    name = os.path.abspath(path) if os.path.isabs(pattern) else os.path.relpath(path)
    wanted = [part for part in pattern.split(os.sep) if part not in ("", os.curdir)]
    return _parts_match(wanted, [part for part in name.split(os.sep) if part not in ("", os.curdir)])


def _parts_match(wanted: list[str], parts: list[str]) -> bool:
    if not wanted:
        return not parts
    if wanted[0] == "**":
        return any(_parts_match(wanted[1:], parts[i:]) for i in range(len(parts) + 1)
                   if not any(p.startswith(".") for p in parts[:i]))
    return (bool(parts) and (not parts[0].startswith(".") or wanted[0].startswith("."))
            and fnmatch.fnmatchcase(parts[0], wanted[0]) and _parts_match(wanted[1:], parts[1:]))
