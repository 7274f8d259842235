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
import glob
import hashlib
import importlib.util
import math
import os
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nas.data.cache import atomic_write, cache_key, cached_json, file_stamp, open_u8, read_json, scan_tokens, write_json
from nas.errors import UsageError

SEPARATOR = b"\x1c"  # ASCII "file separator" between documents; absent from ordinary text
VAL_MODULUS = 20  # a file is validation iff sha1(relative path) % 20 == 0: ~5% of the files
VAL_FRACTION = 0.05  # tail of the tokens used as validation when the by-file rule cannot split
SHARD_MAGIC = 20240520  # llm.c / modded-nanogpt token shard header
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256  # int32 header: magic, version, token count, then zeros
GPT2_VOCAB_PADDED = 50304  # 50257 padded up to a multiple of 64 for efficiency (modded-nanogpt)
# Directories of the standard library that hold tests or third-party code, not the library.
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
TOPICS_REL = "pydoc_data/topics.py"  # the documentation topics, read as text rather than as Python source

Loaded = tuple[Any, Any, int, str]  # train, val, vocab_size, fingerprint


def round_up(n: int, multiple: int = 64) -> int:
    return multiple * math.ceil(n / multiple)


def is_validation_file(rel: str) -> bool:
    """The fixed by-file split rule (see the module docstring)."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % VAL_MODULUS == 0


def _read(path: str | Path, size: int | None = None) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read() if size is None else f.read(size)
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


# --------------------------------------------------------------------------- byte-level text
@dataclass(frozen=True)
class Document:
    """One file of a text corpus: ``rel`` decides its split and names it in the cache key."""

    rel: str
    path: str
    stamp: tuple[int, int]  # (size, mtime_ns)
    split: str | None = None  # "train" to force a split, None to use the by-file rule

    def read(self) -> bytes:
        if self.rel == TOPICS_REL:  # pydoc's topics are text stored in a Python dict
            from pydoc_data.topics import topics

            return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")
        return _read(self.path)


def load_text_corpus(kind: str, docs: list[Document], key_parts: list[Any], cache: Path) -> Loaded:
    """Byte tokens of ``docs`` from the cache, building the entry first if it is missing."""
    stem = cache / f"{kind}-{cache_key(kind, key_parts, [(d.rel, d.stamp, d.split) for d in docs])}"
    meta = read_json(stem.with_suffix(".json"))
    tokens_path = stem.with_suffix(".u8")
    if not (meta and tokens_path.exists() and tokens_path.stat().st_size == meta.get("n_tokens")):
        meta = _build_text_cache(docs, tokens_path, stem.with_suffix(".json"))
    tokens = open_u8(tokens_path, meta["n_tokens"])
    n_train = meta["n_train"]
    return tokens[:n_train], tokens[n_train:], 256, meta["sha256"][:16]


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
                f.write((SEPARATOR if i else b"") + doc.read())
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


FileEntry = tuple[str, str, tuple[int, int]]  # relative posix path, path to open, (size, mtime_ns)


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
            raise UsageError(f"cannot read directory {directory!r}: {exc.strerror or exc}") from None
        for entry in entries:
            rel = rel_dir + entry.name
            if entry.is_dir(follow_symlinks=False):
                if not skip_dir(entry.name):
                    stack.append((rel + "/", entry.path))
            elif keep_file(entry.name) and entry.is_file():
                st = entry.stat()
                found.append((rel, entry.path, (st.st_size, st.st_mtime_ns)))
    return sorted(found)


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


def list_directory(root: Path) -> list[FileEntry]:
    """Files under ``root``, recursively, skipping hidden files and directories and ``__pycache__``."""
    return walk_files(str(root), lambda d: d.startswith(".") or d == "__pycache__", lambda f: not f.startswith("."))


def list_paths(paths: list[Path], base: Path) -> list[FileEntry]:
    """Explicit files (one file, a glob's matches) named relative to ``base``."""
    return [(p.name if p == base else p.relative_to(base).as_posix(), str(p), file_stamp(p)) for p in paths]


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
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if path.stat().st_size == 0:
            raise UsageError(f"data file {str(path)!r} is empty") from None
        raise UsageError(f"data file {str(path)!r} is not a readable .npy array: "
                         f"{' '.join(str(exc).split())}") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iu":
        shape = getattr(arr, "shape", "?")
        raise UsageError(
            f"data file {str(path)!r} holds an array of shape {shape} and dtype {getattr(arr, 'dtype', '?')}; "
            "expected a 1-D integer token array"
        )
    if len(arr) == 0:
        raise UsageError(f"data file {str(path)!r} is empty: its array holds no tokens")
    n_val = max(1, math.ceil(len(arr) * VAL_FRACTION))
    train, val = arr[: len(arr) - n_val], arr[len(arr) - n_val :]
    stats = cached_json(cache / f"npy-{cache_key('npy', str(path.resolve()), file_stamp(path))}.json",
                        lambda: scan_tokens(train, val))
    if stats["min_token"] < 0:
        raise UsageError(f"data file {str(path)!r} holds a negative token ({stats['min_token']}); token ids start at 0")
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
        raise UsageError(f"shard {name!r} is empty")
    if size < SHARD_HEADER_INTS * 4:
        raise UsageError(f"shard {name!r} holds {size} bytes, less than its 1024-byte header")
    header = np.frombuffer(_read(path, SHARD_HEADER_INTS * 4), dtype="<i4")
    if header[0] != SHARD_MAGIC:
        raise UsageError(
            f"shard {name!r} has magic number {header[0]}, expected {SHARD_MAGIC}: "
            "not an llm.c / modded-nanogpt token shard"
        )
    if header[1] != SHARD_VERSION:
        raise UsageError(f"shard {name!r} has version {header[1]}, expected {SHARD_VERSION} (uint16 tokens)")
    n_tokens, held = int(header[2]), (size - SHARD_HEADER_INTS * 4) / 2
    if n_tokens != held:
        held_text = f"{held:.0f}" if held == int(held) else f"{held:.1f} (an odd number of bytes)"
        raise UsageError(f"shard {name!r}: header says {n_tokens} tokens but the file holds {held_text}")
    if n_tokens == 0:
        raise UsageError(f"shard {name!r} holds no tokens")
    return np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_INTS * 4, shape=(n_tokens,))


def load_shards(files: list[Path], where: str, cache: Path) -> Loaded:
    """``*_train_*`` shards form the training split and ``*_val_*`` shards the validation split,
    each in name order; every shard's header is checked. Vocab is 50304 (GPT-2's 50257 padded
    to a multiple of 64, as in modded-nanogpt) unless the largest token needs more."""
    train_files = [p for p in files if "_train_" in p.name]
    val_files = [p for p in files if "_val_" in p.name]
    train_parts = [open_shard(p) for p in train_files]
    val_parts = [open_shard(p) for p in val_files]
    for split, parts in (("train", train_parts), ("val", val_parts)):
        if not parts:
            raise UsageError(f"data {where!r} has no *_{split}_*.bin shard; "
                             f"llm.c shards are named like fineweb_{split}_000001.bin")
    train = train_parts[0] if len(train_parts) == 1 else ConcatTokens(train_parts)
    val = val_parts[0] if len(val_parts) == 1 else ConcatTokens(val_parts)
    stamps = [(str(p.resolve()), file_stamp(p)) for p in train_files + val_files]
    stats = cached_json(cache / f"shards-{cache_key('shards', stamps)}.json", lambda: scan_tokens(train, val))
    return train, val, max(GPT2_VOCAB_PADDED, round_up(stats["max_token"] + 1)), stats["sha256"][:16]


def expand_glob(pattern: str) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
