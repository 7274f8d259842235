"""Checkpoints of a full-scale run: written atomically, read with ``torch.load(weights_only=True)``, checked by name.

A checkpoint holds everything an exact resume needs, as tensors and plain Python values only
(``weights_only=True`` refuses anything else, so a crafted file cannot run code on load):

- ``format`` and ``version`` (a foreign file is refused by name), ``run`` (the run's identity:
  shape key, training config, world size; a checkpoint of another run is refused);
- ``model`` and ``optimizer`` state dicts, ``step`` and ``position`` (the data stream's offset
  in tokens), ``curves`` (the losses so far), ``rng`` (torch's CPU generator state and, on CUDA,
  every device's, as ``bytes``), and ``ema`` (the weight average, when the run scores one).

The RNG states are bytes, not tensors, so that ``torch.load(map_location=...)`` leaves them alone:
``torch.set_rng_state`` and ``torch.cuda.set_rng_state_all`` take CPU byte tensors only, and a run
resumed on a GPU loads with ``map_location=<its device>``, which moved version 1's uint8 tensors
there (a ``TypeError`` at every restart). Version 1 files are still read; their states are copied back.

Writes go to a temporary file in the same folder, are flushed and ``fsync``-ed, renamed over the
previous checkpoint (``os.replace`` is atomic) and the folder is synced, so a kill at any moment
leaves either the previous checkpoint or the new one, whole.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from nas.errors import UsageError

FORMAT = "prism-nas-checkpoint"
VERSION = 2  # 2: RNG states as bytes (1: uint8 tensors, which map_location moved off the CPU)
READS = (1, 2)
CHECKPOINT_NAME = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    """The generators' states as bytes: the CPU's, and every CUDA device's once CUDA is in use."""
    state: dict[str, Any] = {"torch": _bytes(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def _bytes(state: torch.Tensor) -> bytes:
    return state.cpu().numpy().tobytes()


def _cpu_state(value: bytes | torch.Tensor) -> torch.Tensor:
    """A saved generator state as the CPU uint8 tensor the setters take (bytes: version 2; a tensor: version 1)."""
    if isinstance(value, torch.Tensor):
        return value.to("cpu", torch.uint8)
    return torch.frombuffer(bytearray(value), dtype=torch.uint8)


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_cpu_state(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_cpu_state(s) for s in state["cuda"]])


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """``payload`` (plus the format mark) to ``path``, atomically (see the module docstring)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, "version": VERSION, **payload}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def run_differences(stored: Any, run: dict[str, Any], prefix: str = "") -> list[str]:
    """The fields in which a stored run identity (``runners.full.run_identity``) differs from ``run``, one level into
    nested ones: ``['train.seed', 'train.tokens']`` rather than ``['train']``."""
    stored = stored if isinstance(stored, dict) else {}
    found = []
    for key in sorted(set(stored) | set(run)):
        mine, theirs = run.get(key), stored.get(key)
        if mine == theirs:
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict) and not prefix:
            found += run_differences(theirs, mine, f"{key}.")
        else:
            found.append(prefix + key)
    return found


def load_weights_only(path: Path, what: str, map_location: str | torch.device = "cpu", then: str = "") -> Any:
    """``torch.load(weights_only=True)`` of ``path``, or one ``UsageError``: ``<what> '<path>' cannot be read
    (...): <why><then>``. The why is the unpickler's own reason: torch's message opens with advice to load with
    ``weights_only=False``, which a line cut at its first sentences would pass on as ours."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError, ValueError, KeyError,
            AttributeError, TypeError, OSError) as error:
        text = str(error).strip()
        found = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
        why = found.group(1) if found else text.splitlines()[0] if text else type(error).__name__
        why = re.split(r"(?<=[.!?])\s", why, maxsplit=1)[0].rstrip(".")  # its first sentence: torch's advice follows
        if len(why) > 200:
            why = why[:200].rsplit(" ", 1)[0] + " ..."
        raise UsageError(f"{what} {str(path)!r} cannot be read (corrupt, truncated, or not a plain weights-only "
                         f"file): {why}{then}") from None


def read_checkpoint(path: Path, run: dict[str, Any], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The checkpoint at ``path`` for the run ``run``, its tensors on ``map_location`` (RNG states are bytes and
    stay on the host); ``UsageError`` naming the file when it is corrupt, truncated, not a prism-nas checkpoint, or
    another run's."""
    data = load_weights_only(path, "checkpoint", map_location, then="; delete it to start the run again")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UsageError(f"checkpoint {str(path)!r} is not a prism-nas checkpoint; delete it or choose another --out")
    if data.get("version") not in READS:
        raise UsageError(f"checkpoint {str(path)!r} has version {data.get('version')!r}, this prism-nas reads "
                         f"{' and '.join(map(str, READS))}")
    stored = data.get("run")
    if stored != run:
        raise UsageError(f"checkpoint {str(path)!r} belongs to another run (it differs in "
                         f"{', '.join(run_differences(stored, run))}): delete it to start this run again, or train "
                         "into another --out")
    return data
