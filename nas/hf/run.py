"""The trained weights of a ``nas train --out DIR`` or ``nas rerun`` run: its checkpoint, its shape, how far it got.

A run's folder holds ``checkpoint.pt`` (``runners.checkpoint``: the model's ``state_dict``, the
step, the curves, and the run's identity, whose ``arch`` is the shape's key), ``result.json`` once
finished (the shape in full) and, for ``nas rerun``, ``arch.json`` (the carried shape). The exact
shape comes from ``arch.json`` or ``result.json``; the key in the checkpoint must agree with it,
so a checkpoint is never read as another shape. A folder with neither file (an unfinished
``nas train --out`` run) gives only the key: the caller must name the shape (a study row of that key).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nas.arch import ArchConfig
from nas.errors import UsageError
from nas.files import kind_of, show, stat_path
from runners.checkpoint import CHECKPOINT_NAME, FORMAT, load_weights_only
from runners.config import TrainConfig


@dataclass(frozen=True)
class TrainedRun:
    """A checkpoint's weights and what it says about them."""

    path: Path  # the checkpoint file
    key: str  # the shape's key, as the checkpoint's run identity records it
    arch: ArchConfig | None  # the exact shape (arch.json or result.json beside it); None when neither is there
    weights: dict[str, torch.Tensor] = field(repr=False)  # nas.model.Transformer's state_dict
    info: dict[str, Any] = field(default_factory=dict)  # path, step, steps, tokens, seq_len, val_loss, val_tokens

    @property
    def context(self) -> int:
        return int(self.info["seq_len"])


def _load(path: Path) -> dict[str, Any]:
    """The checkpoint's dict, read with ``weights_only=True`` (a crafted file runs nothing)."""
    data = load_weights_only(path, "--checkpoint")
    run = data.get("run") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(run, dict) \
            or not isinstance(run.get("arch"), str) or not isinstance(data.get("model"), dict):
        raise UsageError(f"--checkpoint {str(path)!r} is not a prism-nas checkpoint (what `nas train --out DIR` "
                         "writes as DIR/checkpoint.pt)")
    return data


def _shape_beside(folder: Path) -> tuple[ArchConfig | None, str]:
    """The exact shape stored beside the checkpoint and where it was read (``arch.json`` first)."""
    config = folder / "arch.json"
    if config.is_file():
        try:
            return ArchConfig.from_dict(json.loads(config.read_text(encoding="utf-8"))), str(config)
        except (OSError, ValueError, TypeError, UsageError) as error:  # not UTF-8, not JSON, not a shape
            raise UsageError(f"{show(config)} cannot be read as a shape: {error}") from None
    result = folder / "result.json"
    if result.is_file():
        try:
            stored = json.loads(result.read_text(encoding="utf-8"))
            if isinstance(stored, dict) and isinstance(stored.get("arch"), dict):
                return ArchConfig.from_dict(stored["arch"]), str(result)
        except (OSError, ValueError, TypeError, UsageError) as error:
            raise UsageError(f"{show(result)} cannot be read as a run's result: {error}") from None
    return None, ""


def read_run(path: Path) -> TrainedRun:
    """The run folder's (or checkpoint file's) weights, shape and progress; ``UsageError`` for anything else."""
    stat_path(path, "--checkpoint")  # a name too long for the file system, a folder not ours to read: one line
    if path.is_dir():
        checkpoint = path / CHECKPOINT_NAME
        if not checkpoint.is_file():
            raise UsageError(f"--checkpoint {str(path)!r} holds no {CHECKPOINT_NAME}: give the folder of a "
                             "`nas train --out` or `nas rerun` run, or its checkpoint file")
    elif path.is_file():
        checkpoint = path
    elif (info := stat_path(path, "--checkpoint")) is not None:  # a FIFO, a device: not "does not exist"
        raise UsageError(f"--checkpoint {show(path)} is {kind_of(info.st_mode)}: give the folder of a `nas train "
                         "--out` or `nas rerun` run, or its checkpoint file")
    else:
        raise UsageError(f"--checkpoint {show(path)} does not exist")
    data = _load(checkpoint)
    key = data["run"]["arch"]
    arch, source = _shape_beside(checkpoint.parent)
    if arch is not None and arch.key() != key:
        raise UsageError(f"--checkpoint {str(checkpoint)!r} trains {key}, but {source!r} beside it is another shape "
                         f"({arch.key()}): the folder mixes two runs")
    try:
        train = TrainConfig.from_dict(dict(data["run"].get("train") or {}))
    except (UsageError, TypeError) as error:
        raise UsageError(f"--checkpoint {str(checkpoint)!r}: its training setup cannot be read ({error})") from None
    step = int(data.get("step", 0))
    evals = (data.get("curves") or {}).get("eval") or []
    info = {"path": str(checkpoint), "step": step, "steps": train.steps, "tokens": step * train.tokens_per_step,
            "seq_len": train.seq_len, "val_loss": float(evals[-1][1]) if evals else None,
            "val_tokens": int(evals[-1][0]) if evals else None}
    return TrainedRun(path=checkpoint, key=key, arch=arch, weights=data["model"], info=info)
