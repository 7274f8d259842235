"""The on-disk token cache: where it lives, how entries are keyed, written and read back.

Layout of ``$NAS_CACHE`` (default ``$XDG_CACHE_HOME/prism-nas``, else ``~/.cache/prism-nas``)::

    builtin-<key>.u8     byte tokens, the training split then the validation split, end to end
    builtin-<key>.json   {"format", "n_tokens", "n_train", "sha256", "split", "n_files", ...}
    text-<key>.u8/.json  the same for a user's text file, directory or glob
    shards-<key>.json    max token and content hash of a set of .bin shards (so they are read once)
    npy-<key>.json       the same for a .npy token array

``<key>`` hashes everything the tokens are made from (format version, Python version, every
source file's name, size, modification and change time), so a changed input gets a new entry and an entry is never
silently stale. Writers go through a temporary file and ``os.replace``: several workers may
build the same entry at once, each rename is atomic and they all write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from nas.errors import UsageError

FORMAT_VERSION = 1  # bump when the token layout or the split rule changes: every key changes with it
_CHUNK = 1 << 24  # tokens per read when scanning large arrays (16M tokens, 32 MB as uint16)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$NAS_CACHE``, else ``$XDG_CACHE_HOME/prism-nas`` or ``~/.cache/prism-nas``."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get("NAS_CACHE"):
        root = Path(os.environ["NAS_CACHE"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prism-nas"
    root = root.expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = "it is a file, not a folder" if root.is_file() else exc.strerror or exc  # mkdir says 'File exists'
        raise UsageError(
            f"cannot create the data cache {str(root)!r} ({why}); set NAS_CACHE to a writable directory"
        ) from None
    return root


def cache_key(*parts: Any) -> str:
    """20 hex digits of sha256 over the JSON of ``parts`` (plus the format version)."""
    blob = json.dumps([FORMAT_VERSION, *parts], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


Stamp = tuple[int, int, int]  # (size, mtime_ns, ctime_ns)


def stamp_of(st: os.stat_result) -> Stamp:
    """``(size, mtime_ns, ctime_ns)``: what a cache key records of a file, cheap enough for every load. The change
    time is the kernel's own (no ``touch``, ``cp -p``, ``rsync -t`` or tar sets it): size and modification time
    alone took another file of the same size with the old time for the cached one, and trained on stale tokens."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_stamp(path: Path) -> Stamp:
    return stamp_of(path.stat())


def atomic_write(dest: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Call ``write(f)`` on a temporary file next to ``dest``, then rename it onto ``dest``."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a shared cache must be readable by every worker
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None if it is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path, value: dict[str, Any]) -> None:
    atomic_write(path, lambda f: json.dump(value, f, indent=1, sort_keys=True), mode="w")


TOKEN_STATS = {"sha256": str, "min_token": int, "max_token": int}  # what ``scan_tokens`` returns, and its types


def cached_json(path: Path, compute: Callable[[], dict[str, Any]], fields: dict[str, type]) -> dict[str, Any]:
    """``compute()`` once per cache entry; a read-only cache only costs the recomputation. An entry that lacks one of
    ``fields`` (name: type) is computed again: a damaged file in the cache is a rebuild, not a ``KeyError``."""
    value = read_json(path)
    if value is not None and value.get("format") == FORMAT_VERSION and all(
            type(value.get(name)) is kind for name, kind in fields.items()):  # `is`: a bool is no int here
        return value
    value = {"format": FORMAT_VERSION, **compute()}
    try:
        write_json(path, value)
    except OSError:
        pass
    return value


def open_u8(path: Path, n_tokens: int) -> np.ndarray:
    """Read-only memory map of a byte-token file (an empty array for an empty file: mmap refuses those)."""
    if n_tokens == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(n_tokens,))


def chunks(tokens: Any) -> Iterable[np.ndarray]:
    """Contiguous pieces of a 1-D token array (or ``ConcatTokens``) of at most ``_CHUNK`` tokens."""
    for start in range(0, len(tokens), _CHUNK):
        yield np.ascontiguousarray(tokens[start : start + _CHUNK])


def scan_tokens(train: Any, val: Any) -> dict[str, Any]:
    """sha256 of the exact token content (dtype, length and values of each split) plus min and max token.

    The hash is the data's fingerprint: two machines holding the same tokens agree on it,
    whatever the paths and mtimes, so trials of one study can check they saw the same data.
    """
    h = hashlib.sha256()
    lo, hi = None, None
    for name, tokens in (("train", train), ("val", val)):
        h.update(f"{name}:{tokens.dtype.str}:{len(tokens)};".encode())
        for piece in chunks(tokens):
            h.update(memoryview(piece).cast("B"))
            if len(piece):
                lo = int(piece.min()) if lo is None else min(lo, int(piece.min()))
                hi = int(piece.max()) if hi is None else max(hi, int(piece.max()))
    return {"sha256": h.hexdigest(), "min_token": lo, "max_token": hi}
