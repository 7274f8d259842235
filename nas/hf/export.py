"""A shape (and its weights) as a model directory that ``transformers`` loads, generates with and trains.

``--format hf`` (layout ``prism``) writes any shape: ``config.json`` (with ``auto_map`` naming the
directory's own classes), ``configuration_prism.py`` and ``modeling_prism.py`` (``nas/hf/remote/``:
torch and transformers only, so the directory works where prism-nas is not installed; loaded with
``trust_remote_code=True``), ``model.safetensors`` and ``README.md`` (``nas.hf.card``).
``--format llama`` writes the shapes LLaMA can express as a stock ``LlamaForCausalLM`` directory,
with no remote code.

The weights are a ``nas.model.Transformer`` state dict (a checkpoint's), loaded strictly into the
shape first, so weights of another shape are refused; without one, the project's own
initialisation at a fixed seed. The directory is written into a temporary folder beside the
target and renamed into place: a failure leaves nothing behind, and a reader never sees half a
model. An existing target must be empty, or hold a model directory an earlier export wrote (its record,
``nas-export.json``) and ``force``, which replaces that export's files only (``nas.hf.target``). Every file
is readable as the folder's others are (the umask's mode, as for any file written).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from nas.arch import ArchConfig
from nas.errors import UsageError
from nas.hf.card import Provenance, model_card
from nas.hf.mapping import PRISM_FILES, hf_state_dict, llama_config, llama_refusal, prism_config
from nas.hf.target import MANIFEST, check_clash, check_target, hidden_prefix, manifest_text, move_into_place
from nas.model.transformer import Transformer

FORMATS = {"hf": "prism", "llama": "llama"}  # --format -> layout
REMOTE = Path(__file__).with_name("remote")
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Exported:
    path: Path
    layout: str
    files: tuple[str, ...]  # what the export wrote, its record (MANIFEST) included
    trained: bool
    kept: tuple[str, ...] = ()  # the user's entries a forced replacement carried over


def project_state(arch: ArchConfig, weights: Mapping[str, torch.Tensor] | None,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """``weights`` checked against ``arch`` (strictly: every name, every size), or a fresh initialisation."""
    if weights is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return Transformer(arch).state_dict()
    with torch.device("meta"):  # the shape only: the checkpoint's tensors are assigned, nothing is drawn
        model = Transformer(arch)
    try:
        model.load_state_dict(weights, strict=True, assign=True)
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:300]
        raise UsageError(f"the checkpoint's weights are not those of {arch.label()}: {detail}") from None
    return model.state_dict()


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_model_dir(arch: ArchConfig, out: Path, fmt: str = "hf", provenance: Provenance | None = None,
                    weights: Mapping[str, torch.Tensor] | None = None, context: int = 2048,
                    force: bool = False, reads: Sequence[Path] = ()) -> Exported:
    """Write the model directory of ``arch`` to ``out`` (see the module docstring); ``context`` is the sequence
    length it was trained (or searched) at, stated as ``max_position_embeddings``; ``reads``: what the command
    reads (the storage, the checkpoint), which ``force`` never replaces (``nas.hf.target``)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not a model directory format: choose {' or '.join(FORMATS)}")
    layout = FORMATS[fmt]
    if layout == "llama" and (why := llama_refusal(arch)):
        raise UsageError(f"--format llama: {arch.label()} is no LLaMA: {why}; use --format hf")
    provenance = provenance or Provenance()
    target = check_target(out, force, reads)
    out = target.path
    state = hf_state_dict(project_state(arch, weights, provenance.seed), arch, layout)
    config: dict[str, Any] = prism_config(arch, context) if layout == "prism" else llama_config(arch, context)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=hidden_prefix(out), suffix=".tmp", dir=out.parent))
        _write(tmp / "config.json", json.dumps(config, indent=2) + "\n")
        save_file(state, tmp / WEIGHTS, metadata={"format": "pt"})
        _write(tmp / "README.md", model_card(arch, layout, provenance))
        if layout == "prism":
            for name in PRISM_FILES:
                _write(tmp / name, (REMOTE / name).read_text(encoding="utf-8"))
        written = sorted(p.name for p in tmp.iterdir())
        _write(tmp / MANIFEST, manifest_text(tmp, written))
        files = tuple(sorted((*written, MANIFEST)))
        shared = 0o666 & ~_umask()  # safetensors writes its file private (0600); a model directory is shared
        for name in files:
            os.chmod(tmp / name, shared)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's folder is private too
        try:
            check_clash(tmp, target)
        except UsageError:  # refused before any of the user's entries moved in: the new folder holds ours alone
            shutil.rmtree(tmp, ignore_errors=True)
            tmp = None
            raise
        move_into_place(tmp, target)
    except (OSError, SafetensorError) as error:
        raise UsageError(f"cannot write -o {str(out)!r}: {getattr(error, 'strerror', None) or error}") from None
    finally:  # a failed replacement put the user's entries back; never remove a folder that still holds one
        if tmp is not None and tmp.exists() and not any(os.path.lexists(tmp / name) for name in target.kept):
            shutil.rmtree(tmp, ignore_errors=True)
    return Exported(path=out, layout=layout, files=files, trained=weights is not None, kept=target.kept)
