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
model. An existing target must be empty, or hold a model directory (``config.json``) and ``force``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
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
from nas.model.transformer import Transformer

FORMATS = {"hf": "prism", "llama": "llama"}  # --format -> layout
REMOTE = Path(__file__).with_name("remote")
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Exported:
    path: Path
    layout: str
    files: tuple[str, ...]
    trained: bool


def check_target(out: Path, force: bool) -> Path:
    """``out`` as an absolute path that can become the model directory; ``UsageError`` saying why not."""
    out = Path(os.path.abspath(out))
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise UsageError(f"-o {str(out)!r} is a file: give a folder for the model directory")
        if any(out.iterdir()):
            if not force:
                raise UsageError(f"-o {str(out)!r} exists and is not empty: give a new folder, or --force to "
                                 "replace the model directory it holds")
            if not (out / "config.json").is_file():
                raise UsageError(f"-o {str(out)!r} is not empty and holds no config.json: --force replaces a model "
                                 "directory only; give a new folder")
    if not out.parent.is_dir():
        raise UsageError(f"-o {str(out)!r}: its folder {str(out.parent)!r} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise UsageError(f"-o {str(out)!r}: its folder {str(out.parent)!r} is not writable")
    return out


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


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (empty, or a model directory being replaced) is moved aside
    first and removed after, so ``out`` is always either the old directory or the new one, whole."""
    if not (out.exists() or out.is_symlink()):
        os.replace(tmp, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    os.replace(out, aside / out.name)
    try:
        os.replace(tmp, out)
    except OSError:
        os.replace(aside / out.name, out)  # the old directory back where it was
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def write_model_dir(arch: ArchConfig, out: Path, fmt: str = "hf", provenance: Provenance | None = None,
                    weights: Mapping[str, torch.Tensor] | None = None, context: int = 2048,
                    force: bool = False) -> Exported:
    """Write the model directory of ``arch`` to ``out`` (see the module docstring); ``context`` is the sequence
    length it was trained (or searched) at, stated as ``max_position_embeddings``."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not a model directory format: choose {' or '.join(FORMATS)}")
    layout = FORMATS[fmt]
    if layout == "llama" and (why := llama_refusal(arch)):
        raise UsageError(f"--format llama: {arch.label()} is no LLaMA: {why}; use --format hf")
    provenance = provenance or Provenance()
    out = check_target(out, force)
    state = hf_state_dict(project_state(arch, weights, provenance.seed), arch, layout)
    config: dict[str, Any] = prism_config(arch, context) if layout == "prism" else llama_config(arch, context)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        _write(tmp / "config.json", json.dumps(config, indent=2) + "\n")
        save_file(state, tmp / WEIGHTS, metadata={"format": "pt"})
        _write(tmp / "README.md", model_card(arch, layout, provenance))
        if layout == "prism":
            for name in PRISM_FILES:
                _write(tmp / name, (REMOTE / name).read_text(encoding="utf-8"))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's folder is private; a model directory is not
        files = tuple(sorted(p.name for p in tmp.iterdir()))
        _move_into_place(tmp, out)
    except (OSError, SafetensorError) as error:
        raise UsageError(f"cannot write -o {str(out)!r}: {getattr(error, 'strerror', None) or error}") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return Exported(path=out, layout=layout, files=files, trained=weights is not None)
