"""Token data for training and scoring candidates: ``load_data``, ``BatchSampler``, ``validation_batches``.

``--data`` takes (``load_data(spec)``):

- ``builtin`` (default): the standard library's ``.py`` sources (no ``test``/``tests``/
  ``idle_test`` directories, no site-packages) and ``pydoc_data.topics``, byte-level
  (uint8, vocab 256). Files go to validation by a fixed hash of their path (~5%); the
  topics go to training. Built once into ``$NAS_CACHE`` (see ``nas.data.cache``) and
  memory-mapped from then on; the entry is keyed by the Python version and every file's
  name, size, modification and change time, so it is rebuilt whenever they change.
- a text file, a directory of text files, or a glob: byte-level, split by file with the
  same rule (the last 5% of the tokens when that rule cannot split them), cached the same way.
  Files of any extension other than ``.npy`` and ``.bin`` (in any case) are read as text; a ``.npz`` is refused.
- a ``.npy`` file: a 1-D integer token array; the last 5% is validation;
  vocab = max token + 1 rounded up to a multiple of 64.
- a directory or glob of llm.c / modded-nanogpt ``.bin`` shards: 256 int32 header (magic
  20240520, version 1, token count) then uint16 tokens; ``*_train_*`` shards are the training
  split, ``*_val_*`` the validation split; vocab 50304 (GPT-2's 50257 padded to a multiple of
  64) unless the largest token needs more. A directory holding any ``.bin`` file is read as
  shards; several shards of one split are viewed end to end without copying (``ConcatTokens``).

Batches: ``BatchSampler`` draws random contiguous windows of the training split from its own
``numpy.random.Generator(seed)``; ``validation_batches`` cuts the same ordered windows, spread evenly over
the whole validation split, every time, so every trial of a study is scored on the same tokens.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nas.data.cache import cache_root
from nas.data.discovery import FileEntry, expand_glob, glob_matches, list_directory, list_paths, walks_into
from nas.data.sources import (
    builtin_documents,
    load_npy,
    load_shards,
    load_text_corpus,
    text_documents,
)
from nas.errors import UsageError
from nas.files import COMPANION_ROLES, companion_of, is_sqlite_database, kind_of, show, stat_path, user_path

if TYPE_CHECKING:  # torch is imported where batches are made: a search's parent, which trains nothing, never needs it
    import torch

__all__ = ["TokenData", "load_data", "BatchSampler", "validation_batches", "check_enough_tokens", "check_vocabulary"]


@dataclass(frozen=True, eq=False)
class TokenData:
    """Training and validation tokens of one data source (1-D arrays, dtype as stored)."""

    train: np.ndarray = field(repr=False)  # np.memmap, ndarray, or ConcatTokens for several shards
    val: np.ndarray = field(repr=False)
    vocab_size: int  # 256 byte-level; .bin: 50304 or more; .npy: max token + 1 rounded up to 64
    name: str  # "builtin" or the spec as given
    fingerprint: str  # 16 hex digits of sha256 over the exact tokens of both splits

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "n_train_tokens": len(self.train),
            "n_val_tokens": len(self.val),
            "fingerprint": self.fingerprint,
        }


def load_data(spec: str | os.PathLike[str] = "builtin", cache_dir: str | os.PathLike[str] | None = None) -> TokenData:
    """Load ``spec`` (see the module docstring); one-line ``UsageError`` for every bad input."""
    name = os.fspath(spec)
    if not name.strip():
        raise UsageError("--data is empty: pass 'builtin', a text file, a directory, a glob, a .npy file "
                         "or .bin shards")
    cache = cache_root(cache_dir)
    if name == "builtin":
        docs, key_parts = builtin_documents()
        return _token_data(load_text_corpus("builtin", docs, key_parts, cache), name)

    path = user_path(name, "--data", stored=True)
    info = stat_path(path, "--data")
    if info is not None and stat.S_ISREG(info.st_mode):
        suffix = path.suffix.lower()
        if suffix == ".npz":
            raise UsageError(f"data file {show(name)} is a .npz archive (np.savez): pass its token array as one .npy "
                             "file (np.save(path, tokens))")
        # read before any storage opens: this process holds no SQLite lock on the database yet
        companion = companion_of(path)
        what = ("an SQLite database (a study's storage?)" if is_sqlite_database(path) else
                COMPANION_ROLES[companion[0]].format(db=show(companion[1]))
                if companion is not None and is_sqlite_database(companion[1]) else None)
        if what is not None:
            raise UsageError(f"data file {show(name)} is {what}, not text or tokens: give the text, .npy or .bin "
                             "files to train on (--storage names the study's file)")
        if suffix == ".npy":
            loaded = load_npy(path, cache)
        elif suffix == ".bin":
            loaded = load_shards([path], name, cache)
        else:
            docs = text_documents(list_paths([path], path), skip_binary=False)
            if not docs:
                raise UsageError(f"data file {show(name)} is empty")
            loaded = load_text_corpus("text", docs, [str(path.resolve())], cache)
        return _token_data(loaded, name)
    if info is not None and stat.S_ISDIR(info.st_mode):
        files, base = list_directory(path), path
    elif info is not None:
        raise UsageError(f"--data {show(name)} is {kind_of(info.st_mode)}: pass 'builtin', a text file, a folder, a "
                         "glob, a .npy file or .bin shards")
    elif any(c in name for c in "*?["):
        matches = expand_glob(str(path))
        if not matches:
            raise UsageError(f"data glob {show(name)} matches no files")
        base = Path(os.path.commonpath([p.parent.absolute() for p in matches]))
        files = list_paths([p.absolute() for p in matches], base)
    else:
        raise UsageError(
            f"data {show(name)} not found: pass 'builtin', a text file, a directory, a glob, a .npy file or .bin shards"
        )
    return _token_data(_load_many(files, base, name, cache), name)


def data_holds(spec: str, target: Path) -> bool:
    """Whether the text data ``spec`` reads the folder of ``target`` (a study's storage): a folder that holds it at
    any depth, or a glob that matches it. The files a study's commands write beside it (reports, exports) would be
    read as text too. ``builtin``, single files and shards (a folder or glob holding ``.bin`` files reads those
    alone) hold nothing."""
    if spec == "builtin" or not spec.strip():
        return False
    path, real = user_path(spec, "--data", stored=True), target.resolve()
    if path.is_dir() and walks_into(path.resolve(), real.parent):
        files = [Path(entry) for _, entry, _ in list_directory(path)]
    elif any(c in spec for c in "*?[") and glob_matches(str(path), real):
        files = expand_glob(str(path))
    else:
        return False
    return not any(file.name.lower().endswith(".bin") for file in files)


def _token_data(loaded: tuple[Any, Any, int, str], name: str) -> TokenData:
    train, val, vocab_size, fingerprint = loaded
    return TokenData(train=train, val=val, vocab_size=vocab_size, name=name, fingerprint=fingerprint)


def _load_many(files: list[FileEntry], base: Path, name: str, cache: Path) -> tuple[Any, Any, int, str]:
    """A directory's or a glob's files: ``.bin`` shards if there are any, else text."""
    shards = [Path(path) for rel, path, _ in files if rel.lower().endswith(".bin")]
    if shards:
        return load_shards(shards, name, cache,
                           not_read=[rel for rel, _, _ in files if not rel.lower().endswith(".bin")])
    if any(rel.lower().endswith((".npy", ".npz")) for rel, _, _ in files):
        raise UsageError(f"data {show(name)} holds .npy or .npz files: pass one .npy token array, not a directory or "
                         "glob")
    docs = text_documents(files, skip_binary=True)
    if not docs:
        raise UsageError(f"data {show(name)} holds no non-empty text files or .bin shards")
    return load_text_corpus("text", docs, [str(base.resolve())], cache)


def _need(batch_size: int, seq_len: int) -> int:
    """Tokens in one batch of windows: ``B*T`` inputs plus the one extra target."""
    if batch_size < 1 or seq_len < 1:
        raise UsageError(f"batch size and sequence length must be >= 1 (got {batch_size}x{seq_len})")
    return batch_size * seq_len + 1


def check_enough_tokens(data: TokenData, batch_size: int, seq_len: int) -> None:
    """``UsageError`` unless both splits hold at least one batch of ``batch_size x seq_len``."""
    need = _need(batch_size, seq_len)
    for split, tokens in (("training", data.train), ("validation", data.val)):
        if len(tokens) < need:
            raise UsageError(
                f"data {data.name!r} has {len(tokens)} {split} tokens; one batch of {batch_size}x{seq_len} needs {need}"
            )


def check_vocabulary(vocab_size: int, data: TokenData) -> None:
    """``UsageError`` unless an embedding of ``vocab_size`` rows holds every token id the data can hold."""
    if vocab_size < data.vocab_size:
        raise UsageError(f"vocab_size={vocab_size} is smaller than the data's vocabulary {data.vocab_size}; "
                         f"give at least {data.vocab_size}")


def _windows(tokens: Any, starts: Any, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    buf = np.stack([np.asarray(tokens[s : s + seq_len + 1]) for s in starts]).astype(np.int64)  # (B, T+1)
    buf = torch.from_numpy(buf)
    return buf[:, :-1], buf[:, 1:]  # x, y: (B, T) each; y[b, t] = x[b, t+1]


class BatchSampler:
    """Random contiguous windows from the training split, reproducible from the seed.

    Uses its own ``numpy.random.Generator(seed)``, never the global RNGs: the same seed gives
    the same sequence of batches whatever else the process does.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int) -> None:
        need = _need(batch_size, seq_len)
        if len(tokens) < need:
            raise UsageError(
                f"the training split has {len(tokens)} tokens; one batch of {batch_size}x{seq_len} needs {need}"
            )
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.rng = np.random.default_rng(seed)

    def next_starts(self) -> np.ndarray:
        """The next batch's ``B`` window starts (``start + T + 1 <= len``); the generator advances."""
        return self.rng.integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)

    def windows(self, starts: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``x, y`` of the windows at ``starts``: int64 ``(len(starts), T)``; ``y`` is ``x`` shifted left by one."""
        return _windows(self.tokens, starts, self.seq_len)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``x, y``: int64 ``(B, T)``; ``y`` is ``x`` shifted left by one token."""
        return self.windows(self.next_starts())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()


def validation_batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, n_tokens: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed, ordered, non-overlapping windows spread evenly over the whole validation split.

    ``n_tokens`` is rounded down to ``n`` whole batches of ``B*T`` (at least one, at most what
    the split holds). The split is cut into ``S = (len - 1) // T`` aligned slots and the
    ``W = n*B`` windows take slots ``floor(i*S/W)``, ``i = 0..W-1``: a few thousand tokens then
    sample every part of the split (every file of a text corpus) instead of its first file.
    Windows are dealt to batches round-robin (batch ``b`` holds windows ``b, b+n, b+2n, ...``),
    so any prefix of the batches (the cheap pruning evaluations) is itself spread over the split.
    Window ``i`` is ``x = tokens[s_i : s_i + T]``, ``y = tokens[s_i + 1 : s_i + T + 1]``.
    """
    need = _need(batch_size, seq_len)
    if len(tokens) < need:
        raise UsageError(
            f"the validation split has {len(tokens)} tokens; one batch of {batch_size}x{seq_len} needs {need}"
        )
    per_batch = batch_size * seq_len
    slots = (len(tokens) - 1) // seq_len
    n_batches = max(1, min(n_tokens // per_batch, slots // batch_size))
    n_windows = n_batches * batch_size
    starts = [(i * slots // n_windows) * seq_len for i in range(n_windows)]  # distinct: slots >= n_windows
    return [_windows(tokens, starts[b::n_batches], seq_len) for b in range(n_batches)]
