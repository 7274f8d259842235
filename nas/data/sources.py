"""Where tokens come from: the builtin corpus, text files, ``.npy`` arrays and llm.c ``.bin`` shards.

Each ``load_*`` returns ``(train, val, vocab_size, fingerprint)`` and raises ``UsageError``
with one line for every bad input. ``nas.data.load_data`` picks the loader from the spec.

Text (the builtin corpus included) is byte-level: one token per byte, uint8, vocab 256.
Documents (files) are joined with the ASCII file-separator byte 0x1C, which plays the part
of GPT-2's ``<|endoftext|>``. The split is **by file**: a file goes to validation iff
``int(sha1(relative_path)) % 20 == 0`` (about 5%), a rule that depends on the file's name
only, not on which other files exist or their order. When that leaves either split empty
(one file, or a few), the tokens are laid end to end and the last 5% are the validation split.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import io
import math
import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nas.data.cache import (
    TOKEN_STATS,
    Stamp,
    atomic_write,
    cache_key,
    cached_json,
    file_stamp,
    open_u8,
    read_json,
    scan_tokens,
    write_json,
)
from nas.data.discovery import FileEntry, walk_files
from nas.errors import UsageError
from nas.files import read_bytes, reason, show

SEPARATOR = b"\x1c"  # ASCII "file separator" between documents; absent from ordinary text
VAL_MODULUS = 20  # a file is validation iff sha1(relative path) % 20 == 0: ~5% of the files
VAL_FRACTION = 0.05  # tail of the tokens used as validation when the by-file rule cannot split
SHARD_MAGIC = 20240520  # llm.c / modded-nanogpt token shard header
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256  # int32 header: magic, version, token count, then zeros
NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file (numpy.lib.format)
GPT2_VOCAB_PADDED = 50304  # 50257 padded up to a multiple of 64 for efficiency (modded-nanogpt)
# Directories of the standard library that hold tests or third-party code, not the library.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
TOPICS_REL = "pydoc_data/topics.py"  # the documentation topics, read as text rather than as Python source

_PIECE = 16 * 2**20  # bytes per read when a text file is copied into the cache
SPARSE_MIN_BYTES = 64 * 2**20  # files above this size are checked for holes (a sparse file is no text)
CACHE_MARGIN_BYTES = 256 * 2**20  # free space left on the cache's disk after the text is cached

Loaded = tuple[Any, Any, int, str]  # train, val, vocab_size, fingerprint


def round_up(n: int, multiple: int = 64) -> int:
    return multiple * math.ceil(n / multiple)


def is_validation_file(rel: str) -> bool:
    """The fixed by-file split rule (see the module docstring). ``rel`` is hashed as the bytes of the name on disk: a
    name found in a folder that is not valid UTF-8 arrives with its bytes as surrogates (``surrogateescape``), and
    a valid name hashes as before."""
    return int(hashlib.sha1(rel.encode("utf-8", "surrogateescape")).hexdigest(), 16) % VAL_MODULUS == 0


def _read(path: str | Path, size: int | None = None) -> bytes:
    return read_bytes(Path(path), "data file", size)


def copy_into(path: str | Path, out: Any) -> None:
    """Copy a file into ``out`` in bounded pieces (``_PIECE`` bytes): a text file larger than memory never is
    read whole."""
    try:
        with open(path, "rb") as f:
            while piece := f.read(_PIECE):
                out.write(piece)
    except OSError as exc:
        raise UsageError(f"cannot read data file {show(path)}: {reason(exc)}") from None


# --------------------------------------------------------------------------- byte-level text
@dataclass(frozen=True)
class Document:
    """One file of a text corpus: ``rel`` decides its split and names it in the cache key."""

    rel: str
    path: str
    stamp: Stamp  # (size, mtime_ns, ctime_ns)
    split: str | None = None  # "train" to force a split, None to use the by-file rule

    def read(self) -> bytes:
        """The whole document (small documents only: the cache copies large ones with ``write_to``)."""
        buffer = io.BytesIO()
        self.write_to(buffer)
        return buffer.getvalue()

    def write_to(self, out: Any) -> None:
        """The document's bytes into ``out`` (in bounded pieces)."""
        if self.rel == TOPICS_REL:  # pydoc's topics are text stored in a Python dict
            from pydoc_data.topics import topics

            out.write("\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8"))
            return
        copy_into(self.path, out)


def load_text_corpus(kind: str, docs: list[Document], key_parts: list[Any], cache: Path) -> Loaded:
    """Byte tokens of ``docs`` from the cache, building the entry first if it is missing."""
    stem = cache / f"{kind}-{cache_key(kind, key_parts, [(d.rel, d.stamp, d.split) for d in docs])}"
    meta = read_json(stem.with_suffix(".json"))
    tokens_path = stem.with_suffix(".u8")
    if not (valid_text_meta(meta) and tokens_path.exists() and tokens_path.stat().st_size == meta["n_tokens"]):
        check_room(docs, cache)
        meta = _build_text_cache(docs, tokens_path, stem.with_suffix(".json"))
    tokens = open_u8(tokens_path, meta["n_tokens"])
    n_train = meta["n_train"]
    return tokens[:n_train], tokens[n_train:], 256, meta["sha256"][:16]


def valid_text_meta(meta: dict[str, Any] | None) -> bool:
    """A cache entry's meta as its builder writes it (a damaged one, say ``"n_train": "x"``, is rebuilt)."""
    if not meta:
        return False
    n_tokens, n_train, digest = meta.get("n_tokens"), meta.get("n_train"), meta.get("sha256")
    return (isinstance(n_tokens, int) and not isinstance(n_tokens, bool) and isinstance(n_train, int)
            and not isinstance(n_train, bool) and 0 <= n_train <= n_tokens and isinstance(digest, str)
            and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest))


def check_room(docs: list[Document], cache: Path) -> None:
    """``UsageError`` naming the sizes when the text cannot be cached: a sparse file (mostly holes: NUL bytes no
    text has) or more bytes than the cache's disk has free."""
    total = 0
    for doc in docs:
        if doc.rel == TOPICS_REL:
            continue
        try:
            info = os.stat(doc.path)
        except OSError as exc:
            raise UsageError(f"data file {show(doc.path)} cannot be used: {reason(exc)}") from None
        stored = getattr(info, "st_blocks", None)
        if stored is not None and info.st_size > SPARSE_MIN_BYTES and stored * 512 < info.st_size // 2:
            raise UsageError(f"data file {show(doc.path)} is a sparse file of {_size(info.st_size)} of which only "
                             f"{_size(stored * 512)} is stored: mostly holes (NUL bytes), not text")
        total += info.st_size
    free = shutil.disk_usage(cache).free
    if total + CACHE_MARGIN_BYTES > free:
        raise UsageError(f"the text data is {_size(total)}: its byte tokens need that much in the cache "
                         f"{show(cache)}, which has {_size(free)} free; set NAS_CACHE to a larger disk or tokenise "
                         "it into .bin shards")


def _size(n: int) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _build_text_cache(docs: list[Document], tokens_path: Path, meta_path: Path) -> dict[str, Any]:
    """Write the training documents then the validation documents as one byte file, plus its meta."""
    val = [d for d in docs if d.split is None and is_validation_file(d.rel)]
    val_names = {d.rel for d in val}
    train = [d for d in docs if d.rel not in val_names]
    by_file = bool(val) and bool(train)
    groups = [train, val] if by_file else [docs]
    ends: list[int] = []  # byte offset where each group ends

    def write(f: Any) -> None:
        for group in groups:
            for i, doc in enumerate(group):
                if i:
                    f.write(SEPARATOR)
                doc.write_to(f)
            ends.append(f.tell())

    try:
        atomic_write(tokens_path, write)
    except OSError as exc:
        raise UsageError(
            f"cannot write the data cache {str(tokens_path.parent)!r} ({exc.strerror or exc}); "
            "set NAS_CACHE to a writable directory"
        ) from None
    n_tokens = ends[-1]
    n_train = ends[0] if by_file else n_tokens - max(1, math.ceil(n_tokens * VAL_FRACTION))
    tokens = open_u8(tokens_path, n_tokens)
    meta = {
        "n_tokens": n_tokens,
        "n_train": n_train,
        "n_files": len(docs),
        "n_val_files": len(val) if by_file else 0,
        "split": f"by file: sha1(path) % {VAL_MODULUS} == 0" if by_file else f"last {VAL_FRACTION:.0%} of tokens",
        "python": sys.version,
        **scan_tokens(tokens[:n_train], tokens[n_train:]),
    }
    write_json(meta_path, meta)  # last: an entry with its meta is complete
    return meta


def builtin_documents() -> tuple[list[Document], list[Any]]:
    """The standard library's ``.py`` sources (no tests, no site-packages) and pydoc's topics.

    The topics become one document forced into the training split; their Python wrapper
    ``pydoc_data/topics.py`` is not also read as source, so no text appears twice.
    """
    root = sysconfig.get_paths()["stdlib"]
    files = walk_files(root, lambda d: d in EXCLUDED_DIRS, lambda f: f.endswith(".py"))
    docs = [Document(rel, path, stamp) for rel, path, stamp in files if rel != TOPICS_REL]
    spec = importlib.util.find_spec("pydoc_data.topics")
    if spec and spec.origin and os.path.exists(spec.origin):
        docs.append(Document(TOPICS_REL, spec.origin, file_stamp(Path(spec.origin)), split="train"))
    if not docs:
        raise UsageError(f"--data builtin: no Python sources under {root!r}; pass a text file or directory instead")
    docs.sort(key=lambda d: d.rel)
    return docs, [sys.version, root]


def text_documents(files: list[FileEntry], skip_binary: bool) -> list[Document]:
    """Non-empty files as documents; with ``skip_binary`` (directories and globs) a file with
    a NUL byte in its first 8 kB is skipped as binary (git's heuristic)."""
    return [
        Document(rel, path, stamp)
        for rel, path, stamp in files
        if stamp[0] > 0 and not (skip_binary and b"\0" in _read(path, 8192))
    ]


# --------------------------------------------------------------------------- .npy
def load_npy(path: Path, cache: Path) -> Loaded:
    """A 1-D integer token array; the last 5% is validation; vocab = max token + 1 rounded up to 64."""
    if path.stat().st_size and _read(path, len(NPY_MAGIC)) != NPY_MAGIC:  # np.load would try to unpickle it
        raise UsageError(f"data file {show(path)} is not a .npy file (it does not start with numpy's header): "
                         "save token ids with np.save(path, tokens.astype(np.uint16)), not tofile()")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if path.stat().st_size == 0:
            raise UsageError(f"data file {show(path)} is empty") from None
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise UsageError(f"data file {show(path)} holds Python objects (a pickled object array), not token ids: "
                             "save a 1-D integer array (np.save(path, tokens.astype(np.uint16)))") from None
        raise UsageError(f"data file {show(path)} is not a readable .npy array: "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iu":
        shape = getattr(arr, "shape", "?")
        raise UsageError(
            f"data file {show(path)} holds an array of shape {shape} and dtype {getattr(arr, 'dtype', '?')}; "
            "expected a 1-D integer token array"
        )
    if len(arr) == 0:
        raise UsageError(f"data file {show(path)} is empty: its array holds no tokens")
    n_val = max(1, math.ceil(len(arr) * VAL_FRACTION))
    train, val = arr[: len(arr) - n_val], arr[len(arr) - n_val :]
    stats = cached_json(cache / f"npy-{cache_key('npy', str(path.resolve()), file_stamp(path))}.json",
                        lambda: scan_tokens(train, val), TOKEN_STATS)
    if stats["min_token"] < 0:
        raise UsageError(f"data file {show(path)} holds a negative token ({stats['min_token']}); token ids start at 0")
    return train, val, round_up(stats["max_token"] + 1), stats["sha256"][:16]


# --------------------------------------------------------------------------- llm.c .bin shards
class ConcatTokens:
    """Read-only 1-D view of several token arrays end to end, without copying them.

    FineWeb's training shards total many GB; ``np.concatenate`` would read them all into
    memory in every worker. Slicing (``x[a:b]``, step 1) and ``len`` are all the samplers need.
    """

    ndim = 1

    def __init__(self, parts: list[np.ndarray]) -> None:
        self.parts = parts
        self.dtype = parts[0].dtype
        self.starts = [0]
        for p in parts:
            self.starts.append(self.starts[-1] + len(p))

    def __len__(self) -> int:
        return self.starts[-1]

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def size(self) -> int:
        return len(self)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("ConcatTokens supports contiguous slices only")
            pieces = []
            while start < stop:
                i = bisect.bisect_right(self.starts, start) - 1
                end = min(stop, self.starts[i + 1])
                pieces.append(self.parts[i][start - self.starts[i] : end - self.starts[i]])
                start = end
            return np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)
        index = int(index) + (len(self) if index < 0 else 0)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} tokens")
        i = bisect.bisect_right(self.starts, index) - 1
        return self.parts[i][index - self.starts[i]]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.concatenate(self.parts)
        return out if dtype is None else out.astype(dtype)


def open_shard(path: Path) -> np.ndarray:
    """Validate an llm.c shard header and memory-map its uint16 tokens.

    Format (llm.c ``dev/data/data_common.py``, modded-nanogpt ``_load_data_shard``):
    256 int32 little-endian header ``[20240520, 1, n_tokens, 0, ...]`` then ``n_tokens`` uint16.
    """
    size = path.stat().st_size
    name = str(path)
    if size == 0:
        raise UsageError(f"shard {show(name)} is empty")
    if size < SHARD_HEADER_INTS * 4:
        raise UsageError(f"shard {show(name)} holds {size} bytes, less than its 1024-byte header")
    header = np.frombuffer(_read(path, SHARD_HEADER_INTS * 4), dtype="<i4")
    if header[0] != SHARD_MAGIC:
        raise UsageError(
            f"shard {show(name)} has magic number {header[0]}, expected {SHARD_MAGIC}: "
            "not an llm.c / modded-nanogpt token shard"
        )
    if header[1] != SHARD_VERSION:
        raise UsageError(f"shard {show(name)} has version {header[1]}, expected {SHARD_VERSION} (uint16 tokens)")
    n_tokens, held = int(header[2]), (size - SHARD_HEADER_INTS * 4) / 2
    if n_tokens != held:
        held_text = f"{held:.0f}" if held == int(held) else f"{held:.1f} (an odd number of bytes)"
        raise UsageError(f"shard {show(name)}: header says {n_tokens} tokens but the file holds {held_text}")
    if n_tokens == 0:
        raise UsageError(f"shard {show(name)} holds no tokens")
    return np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_INTS * 4, shape=(n_tokens,))


def load_shards(files: list[Path], where: str, cache: Path, not_read: Sequence[str] = ()) -> Loaded:
    """``*_train_*`` shards form the training split and ``*_val_*`` shards the validation split,
    each in name order; every shard's header is checked. Vocab is 50304 (GPT-2's 50257 padded
    to a multiple of 64, as in modded-nanogpt) unless the largest token needs more.

    ``not_read``: the other files of the folder or glob (a folder holding any ``.bin`` is read as shards),
    named when a split is missing so that a text folder with one stray ``.bin`` says why its text was ignored."""
    both = [p for p in files if "_train_" in p.name and "_val_" in p.name]
    if both:  # it would be read into both splits: validation on training tokens
        raise UsageError(f"shard {show(str(both[0]))} is named both *_train_* and *_val_*: rename it to one of them")
    train_files = [p for p in files if "_train_" in p.name]
    val_files = [p for p in files if "_val_" in p.name]
    train_parts = [open_shard(p) for p in train_files]
    val_parts = [open_shard(p) for p in val_files]
    for split, parts in (("train", train_parts), ("val", val_parts)):
        if not parts:
            plural = "s" if len(not_read) > 1 else ""
            ignored = (f" (read as llm.c shards because it holds .bin files; its {len(not_read)} other "
                       f"file{plural}, e.g. {show(not_read[0])}, not read)") if not_read else ""
            raise UsageError(f"data {show(where)} has no *_{split}_*.bin shard{ignored}; "
                             f"llm.c shards are named like fineweb_{split}_000001.bin")
    train = train_parts[0] if len(train_parts) == 1 else ConcatTokens(train_parts)
    val = val_parts[0] if len(val_parts) == 1 else ConcatTokens(val_parts)
    stamps = [(str(p.resolve()), file_stamp(p)) for p in train_files + val_files]
    stats = cached_json(cache / f"shards-{cache_key('shards', stamps)}.json", lambda: scan_tokens(train, val),
                        TOKEN_STATS)
    return train, val, max(GPT2_VOCAB_PADDED, round_up(stats["max_token"] + 1)), stats["sha256"][:16]
