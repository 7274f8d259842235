"""The model directory ``nas export --format hf|llama -o DIR`` writes, and what ``--force`` may replace there.

Every export writes ``MANIFEST`` (``nas-export.json``) into its directory: the name and sha256 of each file
it wrote. ``--force`` replaces a non-empty directory only when that record says an export wrote it, and then
only those files, unchanged since:

- a file or folder the user added beside them (a ``tokenizer.json``, a training run's checkpoints) is carried
  into the new directory whole, and the command's last line names it;
- a listed file that changed since the export (weights a training saved over it) is refused: replacing it
  would lose it;
- a folder no export wrote is refused (a project folder that happens to hold a ``config.json``); one that an
  export older than the record wrote is known by its exact file list;
- so are, with or without ``--force``, the working directory and every folder above it (the export replaces
  its folder whole), and a folder holding what the command reads (the SQLite storage, the checkpoint).

Each refusal is one ``UsageError`` naming the folder, what in it is refused and what to do, before anything is
read or written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nas.errors import UsageError
from nas.files import reason, show

MANIFEST = "nas-export.json"
WRITTEN_BY = "prism-nas: nas export"
# the file lists of the exports before MANIFEST: --format llama, --format hf
LEGACY_LAYOUTS = (frozenset({"README.md", "config.json", "model.safetensors"}),
                  frozenset({"README.md", "config.json", "model.safetensors", "configuration_prism.py",
                             "modeling_prism.py"}))
NAMED = 3  # how many names a message lists before "and N more"


@dataclass(frozen=True)
class Target:
    """A folder that can become the model directory: ``path`` (absolute) and the user's entries in it that a
    forced replacement carries into the new directory (``kept``, names)."""

    path: Path
    kept: tuple[str, ...] = ()


def _names(names: Iterable[str]) -> str:
    listed = sorted(names)
    more = f" and {len(listed) - NAMED} more" if len(listed) > NAMED else ""
    return ", ".join(show(n) for n in listed[:NAMED]) + more


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def manifest_text(folder: Path, names: Iterable[str]) -> str:
    """``MANIFEST``'s content for the files ``names`` of ``folder``, as written."""
    files = {name: sha256(folder / name) for name in sorted(names)}
    return json.dumps({"written_by": WRITTEN_BY, "files": files}, indent=1) + "\n"


def _export_card(path: Path) -> bool:
    """Whether ``path`` reads as the model card an export wrote (it names prism-nas): the file names alone of an
    export made before the record (README.md, config.json, model.safetensors) are also a user's own model's."""
    try:
        with open(path, "rb") as file:
            return b"prism-nas" in file.read(1 << 16)
    except OSError:
        return False


def _recorded(out: Path, present: set[str]) -> dict[str, str | None]:
    """The files an earlier export wrote into ``out`` (name -> sha256, None where only the name is known);
    ``UsageError`` when no export wrote the folder."""
    record = out / MANIFEST
    if MANIFEST in present:
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
            files = data["files"] if data.get("written_by") == WRITTEN_BY else None
        except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
            files = None
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                                  files.items()):
            raise UsageError(f"-o {show(out)}: its {MANIFEST} is not the record an export writes, so what an export "
                             "wrote there is not known: --force replaces only that; give a new folder")
        return dict(files)
    if frozenset(present) in LEGACY_LAYOUTS and _export_card(out / "README.md"):
        return dict.fromkeys(present)
    strangers = present - set().union(*LEGACY_LAYOUTS)
    raise UsageError(f"-o {show(out)} holds {_names(strangers or present)}, which no nas export wrote (it has no "
                     f"{MANIFEST}): --force replaces only a model directory an export wrote; give a new folder")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_target(out: Path, force: bool, reads: Sequence[Path] = ()) -> Target:
    """``out`` as a ``Target`` that can become the model directory (module docstring); ``reads``: the files and
    folders the command reads, never replaced."""
    try:
        return _check_target(out, force, reads)
    except OSError as error:  # a name too long, a folder that cannot be searched: no traceback
        raise UsageError(f"-o {show(out)} cannot be a model directory: {reason(error)}") from None


def _check_target(out: Path, force: bool, reads: Sequence[Path]) -> Target:
    out = Path(os.path.abspath(out))
    real = Path(os.path.realpath(out))
    if _inside(Path(os.path.realpath(os.getcwd())), real):
        where = "the working directory" if real == Path(os.path.realpath(os.getcwd())) else \
            "a folder above the working directory"
        raise UsageError(f"-o {show(out)} is {where}: the export replaces its folder whole; give a new folder "
                         "(e.g. -o model)")
    kept: tuple[str, ...] = ()
    if out.is_symlink():  # the export replaces a folder whole, by renaming: a link would be replaced, not its folder
        target = os.readlink(out)
        raise UsageError(f"-o {show(out)} is a symbolic link to {show(target)}"
                         f"{'' if out.exists() else ', which does not exist'}: give the folder itself")
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"-o {show(out)} is a file: give a folder for the model directory")
        try:
            present = {entry.name for entry in os.scandir(out)}
        except OSError as error:
            raise UsageError(f"-o {show(out)} cannot be read: {error.strerror or error}") from None
        if present:
            if not force:
                raise UsageError(f"-o {show(out)} exists and is not empty: give a new folder, or --force to "
                                 "replace the model directory an earlier export wrote there")
            for path in reads:
                if _inside(Path(os.path.realpath(path)), real):
                    raise UsageError(f"-o {show(out)} holds {show(path)}, which this command reads: --force never "
                                     "replaces it; give another folder")
            recorded = _recorded(out, present)
            changed = [name for name, digest in recorded.items() if name in present and digest is not None and
                       ((out / name).is_symlink() or not (out / name).is_file() or sha256(out / name) != digest)]
            if changed:
                raise UsageError(f"-o {show(out)}: {_names(changed)} changed since nas export wrote "
                                 f"{'them' if len(changed) > 1 else 'it'}, and --force would lose "
                                 f"{'them' if len(changed) > 1 else 'it'}: move {'them' if len(changed) > 1 else 'it'}"
                                 " away or give a new folder")
            kept = tuple(sorted(present - set(recorded) - {MANIFEST}))
    if not out.parent.is_dir():
        raise UsageError(f"-o {show(out)}: its folder {show(out.parent)} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise UsageError(f"-o {show(out)}: its folder {show(out.parent)} is not writable")
    return Target(out, kept)


def check_clash(tmp: Path, target: Target) -> None:
    """``UsageError`` when a user's entry that a forced replacement would carry over has the name of a file this
    export wrote into ``tmp``."""
    clash = [name for name in target.kept if (tmp / name).exists()]
    if clash:
        raise UsageError(f"-o {show(target.path)} holds {_names(clash)}, which no export wrote there and this one "
                         "would write: move it away or give a new folder")


NAME_MAX = 255  # bytes in one name: Linux's file systems (ext4, xfs, btrfs, tmpfs) and macOS's APFS


def hidden_prefix(out: Path) -> str:
    """``.NAME.``, the prefix of the hidden folders written beside ``out`` (``tempfile.mkdtemp`` adds 8 characters
    and ``.tmp`` or ``.old``), with NAME cut to the bytes that leave the whole name within ``NAME_MAX``: a folder
    name of 242-255 bytes, valid itself, was refused as too long for its hidden sibling's."""
    room = NAME_MAX - len(".") - len(".") - 8 - len(".tmp")
    return f".{os.fsdecode(os.fsencode(out.name)[:room])}."


def move_into_place(tmp: Path, target: Target) -> None:
    """Make the folder ``tmp`` the model directory ``target.path``: the user's entries (``target.kept``) are moved
    into ``tmp`` first, an existing directory is moved aside and removed after, so ``target.path`` is always the
    old directory or the new one, whole; a failure, or a stop (Ctrl-C, SIGTERM, SIGHUP: ``nas export`` raises on
    each), puts everything back where it was."""
    out = target.path
    check_clash(tmp, target)
    if not (out.exists() or out.is_symlink()):
        os.replace(tmp, out)
        return
    carried: list[str] = []
    aside = Path(tempfile.mkdtemp(prefix=hidden_prefix(out), suffix=".old", dir=out.parent))
    try:
        for name in target.kept:
            os.replace(out / name, tmp / name)
            carried.append(name)
        os.replace(out, aside / out.name)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(aside / out.name, out)  # the old directory back where it was
            raise
    except BaseException:
        for name in carried:  # the user's entries back into the old directory
            os.replace(tmp / name, out / name)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
