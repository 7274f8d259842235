"""Launching one re-run: ``nas train`` in a child process, or ``torchrun --nproc-per-node N`` of them.

Each run is a fresh process (a clean CUDA context, its own process group). The child dies with
its parent (Linux ``PR_SET_PDEATHSIG``), so killing ``nas rerun`` stops the training too and the
same command resumes it from its checkpoint. The child runs in a session of its own, so a
terminal's Ctrl-C reaches the parent alone, which stops the child without a word from it. The
child's progress lines go to our stderr; its result JSON is read back from the run's folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nas.arch import ArchConfig
from nas.errors import UsageError
from nas.rerun.plan import PlannedRun
from runners.config import STEPS_NOTE_SHOWN
from runners.full import read_result
from runners.orphans import die_with_parent


@dataclass(frozen=True)
class LaunchOptions:
    preset: str
    data: str = "builtin"
    tokens: int | None = None
    nproc: int = 1
    device: str | None = None
    compile: bool = False
    micro_batch: int = 0
    checkpoint_every: int = 0
    threads: int = 0


def train_command(run: PlannedRun, options: LaunchOptions) -> list[str]:
    """The command line that trains ``run`` (torchrun when ``nproc`` > 1)."""
    args = ["train", "--config", str(run.folder / "arch.json"), "--preset", options.preset, "--seed", str(run.seed),
            "--out", str(run.folder), "--data", options.data, "--checkpoint-every", str(options.checkpoint_every),
            "--micro-batch", str(options.micro_batch), "--threads", str(options.threads),
            "--compile" if options.compile else "--no-compile"]
    args += ["--tokens", str(options.tokens)] if options.tokens else []
    args += ["--device", options.device] if options.device else []
    if options.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={options.nproc}",
                "-m", "nas", *args]
    return [sys.executable, "-m", "nas", *args]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, then theirs), read from ``/proc``; [] elsewhere."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; comm may hold spaces
        parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_quietly(child: subprocess.Popen) -> None:
    """End a launched run and everything it started (torchrun's workers run in sessions of their own) with SIGKILL:
    nothing prints a traceback, and the run resumes from its last checkpoint (written whole or not at all)."""
    for pid in [child.pid, *descendants(child.pid)]:  # listed before the first dies and its children move away
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    child.wait()


def check_carried_shape(run: PlannedRun, config: Path) -> None:
    """``UsageError`` unless the run folder's ``arch.json`` is the shape planned for it: the run is recorded under
    the planned shape, so a file edited (or replaced) by hand would train one shape and store it as another."""
    try:
        held = ArchConfig.from_json(config.read_text())
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as error:  # UsageError is a ValueError
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"run folder '{run.folder}' holds an arch.json that cannot be read ({reason}); delete the "
                         f"folder to train the planned shape {run.target.label()} again") from None
    if held != run.target:
        raise UsageError(f"run folder '{run.folder}' holds arch.json of {held.label()}, not the planned shape "
                         f"{run.target.label()}: edited or replaced by hand? Delete the folder to train the planned "
                         "shape again")


def launch(run: PlannedRun, options: LaunchOptions) -> tuple[int, dict[str, Any] | None]:
    """Train ``run`` to its end (resuming its checkpoint if it has one): (exit code, its result or None).

    The child runs in a session of its own, so a terminal's Ctrl-C (SIGINT to the whole foreground process group)
    reaches ``nas rerun`` alone, which says so in its one line; the child is then stopped quietly
    (``stop_quietly``) instead of printing its own ``KeyboardInterrupt`` traceback."""
    run.folder.mkdir(parents=True, exist_ok=True)
    config = run.folder / "arch.json"
    if config.exists():
        check_carried_shape(run, config)
    else:
        config.write_text(run.target.to_json())
    with open(run.folder / "stdout.json", "w") as stdout:
        # the re-run printed the preset's whole-steps note once for all its runs: each child keeps it to itself
        child = subprocess.Popen(train_command(run, options), stdout=stdout, preexec_fn=die_with_parent,
                                 start_new_session=True, env={**os.environ, STEPS_NOTE_SHOWN: "1"})
        try:
            code = child.wait()
        except BaseException:  # Ctrl-C, SIGTERM turned into an exception, anything: the run must not go on alone
            stop_quietly(child)
            raise
    return code, read_result(run.folder)
