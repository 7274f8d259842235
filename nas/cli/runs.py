"""``nas train``: one run of one shape outside any study (what ``torchrun`` launches for ``nas rerun``)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path
from typing import Annotated

import typer

from nas.cli.app import app
from nas.cli.errors import INTERRUPTED_EXIT_CODE
from nas.errors import UsageError
from nas.files import OutputFile, output_folder, refuse_inside, show
from nas.units import parse_size


@app.command()
def train(
    config: Annotated[str, typer.Option("--config", help="A shape: an ArchConfig JSON, or a `nas best --format "
                                         "json` / `nas export` file (its row --rank, default the best).")],
    rank: Annotated[int | None, typer.Option("--rank", help="The row of a leaderboard file with this rank (1 = the "
                                                "best; rows without a rank: the Nth).", show_default=False)] = None,
    preset: Annotated[str, typer.Option("--preset", help="Training setup: see `nas presets`.")] = "cpu",
    data: Annotated[str, typer.Option("--data", help="As for nas search (FineWeb .bin shards for the GPU "
                                      "presets).")] = "builtin",
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens, e.g. 2.5B (default the "
                                                  "preset's).", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of init and data order.")] = 0,
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda, cuda:N or mps.",
                                                  show_default=False)] = None,
    out_text: Annotated[str | None, typer.Option("--out", help="The run's folder: checkpoints, log.jsonl, "
                                                "result.json; the same command resumes it. Default: keep "
                                                "nothing.", show_default=False)] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Steps between checkpoints "
                                                  "(0: about every 10 % of the run).")] = 0,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per forward on each process "
                                             "(0: its whole share of the global batch); gradients accumulate "
                                             "to the preset's global batch.")] = 0,
    compile: Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile the model (its "
                                                 "plain-PyTorch ops); default: on a GPU, not on a CPU.",
                                                 show_default=False)] = None,
    threads: Annotated[int, typer.Option("--threads", help="Torch threads per process (0: the cores / "
                                         "processes).")] = 0,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Also write the result JSON here "
                                                   "(default: stdout only); not a file or folder the run reads.",
                                                   show_default=False)] = None,
) -> None:
    """Train one shape at a preset and print its result as JSON; under torchrun, every process trains (DDP).
    Ctrl-C, `kill -INT` or `kill`: exit 130, and with --out the same command resumes from the last checkpoint."""
    from nas.configs import read_arch_config
    from runners.config import STEPS_NOTE_SHOWN
    from runners.presets import get_preset

    arch = read_arch_config(config, rank)
    out = output_folder(out_text, "--out") if out_text is not None else None
    inputs = read_inputs(config, data, out)
    if out is not None:  # the run's folder inside a folder of data: its log would be read as data next time
        refuse_inside(out, f"--out {show(out)}", [(flag, path) for flag, path in inputs if flag == "--data"])
    target = OutputFile.of(output, "-o").check_apart(inputs) if output is not None else None  # refused now, not
    if target is not None and not target.is_stdout:  # after the training
        refuse_glob_match(target.target, data)
    if checkpoint_every < 0 or micro_batch < 0 or threads < 0:
        bad = next(f"{flag} {value}" for flag, value in (("--checkpoint-every", checkpoint_every),
                                                          ("--micro-batch", micro_batch), ("--threads", threads))
                   if value < 0)
        raise UsageError(f"{bad} is invalid: give 0 or a positive number")
    overrides = {"seed": seed, "threads": threads,
                 **({"tokens": parse_size(tokens, "--tokens")} if tokens is not None else {}),
                 **({"device": device} if device is not None else {})}
    cfg = get_preset(preset).train.with_(**overrides)
    if compile is None:
        from runners.device import compiles_by_default, resolve_device

        compile = compiles_by_default(resolve_device(cfg.device))
    cfg = cfg.with_(compile=compile)
    # one note a run: under torchrun rank 0's, and none in a `nas rerun` child (its launcher said it once)
    if (rounded := cfg.whole_steps_note()) and int(os.environ.get("RANK", "0")) == 0 \
            and not os.environ.get(STEPS_NOTE_SHOWN):
        typer.echo(f"note: {rounded}", err=True)

    from nas.data import load_data
    from nas.study.signals import interruptible, raise_if_stopped
    from runners.full import RunOptions, run_full

    raise_if_stopped()  # a stop since `nas` started (nas.cli.main) whose exception an import swallowed
    interruptible()  # Ctrl-C, `kill -INT` (a background job's SIGINT is ignored until now) and SIGTERM: one line
    speaks = int(os.environ.get("RANK", "0")) == 0  # under torchrun, rank 0 speaks for the run
    try:
        result = run_full(arch, cfg, load_data(data), RunOptions(out=out, checkpoint_every=checkpoint_every,
                                                                 micro_batch=micro_batch))
    except KeyboardInterrupt:
        if speaks:
            typer.echo(interrupted(out), err=True)
        raise typer.Exit(INTERRUPTED_EXIT_CODE) from None
    except (RuntimeError, MemoryError) as error:  # past the check's lower bound (runners.memory): one line, exit 2
        from runners.device import is_out_of_memory
        from runners.distributed import lost_a_peer, peer_lost_text

        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and lost_a_peer(error) and not is_out_of_memory(error):
            typer.echo(f"error: rank {os.environ.get('RANK', '?')}: another process of this run stopped "
                       f"({peer_lost_text(error)}); " + interrupted(out).removeprefix("interrupted: "), err=True)
            raise typer.Exit(1) from None
        if not is_out_of_memory(error):
            raise
        rows = micro_batch or cfg.batch_size
        asked = re.search(r"tried to allocate (\d+ bytes|[\d.]+ ?[KMGT]?i?B)", str(error), re.IGNORECASE)
        failed = f"an allocation of {asked.group(1)} failed" if asked else str(error).strip().splitlines()[0][:160]
        raise UsageError(f"training {arch.label()} ran out of memory on {cfg.device} ({failed}): a forward of "
                         f"{rows} sequences of {cfg.seq_len} tokens needs more than this machine gives; give a "
                         "smaller --micro-batch (the same global batch, in more passes) or a smaller shape") from None
    if not speaks:
        return
    text = json.dumps(result, indent=2, default=str)
    typer.echo(text)  # first: a file that cannot be written after all still leaves the result on the screen
    if target is not None:
        target.write(text + "\n")
    if result["status"] != "ok":
        typer.echo(f"run ended {result['status']}: {result['reason']}", err=True)
        raise typer.Exit(1)


def refuse_glob_match(target: Path, data: str) -> None:
    """``UsageError`` when ``-o`` is a file that a ``--data`` glob would read next time (``texts/*.txt``)."""
    if any(c in data for c in "*?[") and fnmatch.fnmatch(os.path.abspath(target),
                                                       os.path.abspath(os.path.expanduser(data))):
        raise UsageError(f"-o {show(target)} matches the --data glob {show(data)}: the next run would read it as "
                         "data; choose another name")


def read_inputs(config: str, data: str, out: Path | None) -> list[tuple[str, Path]]:
    """What ``nas train`` reads, and its run's own files, as ``OutputFile.check_apart`` takes them: the shape file, the
    data (a file, a folder, or each file a glob matches) and the run folder's checkpoint and log."""
    from nas.data.discovery import expand_glob
    from nas.files import user_path
    from runners.checkpoint import CHECKPOINT_NAME

    inputs = [("--config", user_path(config, "--config"))]
    if data != "builtin" and data.strip():
        path = user_path(data, "--data")
        matches = [path] if path.exists() or not any(c in data for c in "*?[") else expand_glob(str(path))
        inputs += [("--data", match) for match in matches]
    if out is not None:
        inputs += [(f"--out run's {name}", out / name) for name in (CHECKPOINT_NAME, "log.jsonl")]
    return inputs


def interrupted(out: Path | None) -> str:
    """The one line a stopped ``nas train`` prints: what it kept, and how to go on."""
    from runners.checkpoint import CHECKPOINT_NAME

    if out is None:
        return "interrupted: nothing was kept (--out FOLDER keeps checkpoints that the same command resumes from)"
    if not (out / CHECKPOINT_NAME).is_file():  # stopped before its first checkpoint (or before the folder was made)
        return f"interrupted: no checkpoint was written in {str(out)!r} yet; the same command starts the run again"
    return f"interrupted: {str(out)!r} keeps the run's last checkpoint; run the same command to resume from it"
