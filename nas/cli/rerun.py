"""``nas rerun``: train the proxy's best shapes and the baseline at a target preset and record them in the storage."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nas.cli.app import app
from nas.cli.errors import INTERRUPTED_EXIT_CODE
from nas.cli.options import StorageOpt, StudyOpt
from nas.errors import UsageError
from nas.files import output_folder
from nas.study.config import DEFAULT_STORAGE, display_url, hidden_password_note
from nas.units import parse_size

if TYPE_CHECKING:
    import optuna
    import torch

    from nas.data import TokenData
    from nas.rerun.launch import LaunchOptions
    from nas.rerun.plan import PlannedRun, PlannedShape, ProxyRanking, RerunSettings
    from reports.frame import StudyData
    from runners.config import TrainConfig
    from runners.presets import Preset


def proxy_ranking(data: StudyData) -> ProxyRanking:
    """The proxy study as ``nas.rerun.plan`` reads it: the board's order (the shrunk ranking) and the shapes."""
    from nas.arch import ArchConfig
    from nas.rerun.plan import ProxyRanking

    ranked = tuple((int(r.rank), str(r.key)) for r in data.board.itertuples()) if not data.board.empty else ()
    archs: dict[str, ArchConfig] = {}
    for t in data.trials:
        key, arch = t.user_attrs.get("key"), t.user_attrs.get("arch")
        if isinstance(key, str) and isinstance(arch, dict) and key not in archs:
            archs[key] = ArchConfig.from_dict(arch)
    return ProxyRanking(data.name, data.baseline_key, ranked, archs, data.space)


@dataclass(frozen=True)
class Target:
    """A re-run's target as the command line gives it, checked: the preset, its training setup after ``--tokens``,
    the data, and how each run is launched."""

    preset: Preset
    train: TrainConfig
    dataset: TokenData
    options: LaunchOptions
    device: torch.device  # where the runs train (runners.device.check_runnable: present, its dtype, its compiler)


def check_target(preset: str, tokens: str | None, data: str, nproc: int, device: str | None, compile: bool | None,
                 micro_batch: int = 0, checkpoint_every: int = 0, threads: int = 0) -> Target:
    """Every option of a re-run checked before anything is written (``UsageError`` in one line): the preset, the
    tokens, the device (and whether it compiles there), the data and the split of the global batch."""
    from nas.data import check_enough_tokens, load_data
    from nas.rerun.launch import LaunchOptions
    from runners.device import check_runnable, compiles_by_default
    from runners.presets import get_preset
    from runners.stream import check_batch_split

    for flag, value in (("--nproc", nproc),):
        if value < 1:
            raise UsageError(f"{flag} {value} is invalid: give at least 1")
    for flag, value in (("--micro-batch", micro_batch), ("--checkpoint-every", checkpoint_every),
                        ("--threads", threads)):
        if value < 0:
            raise UsageError(f"{flag} {value} is invalid: give 0 or a positive number")
    target = get_preset(preset)
    budget = parse_size(tokens, "--tokens") if tokens is not None else None
    given = {"tokens": budget, "device": device}
    target.train.with_(**{name: value for name, value in given.items() if value is not None})  # checks them
    name = device or target.train.device
    where = f"--device {device}" if device else f"preset {preset}"
    if compile is None:  # by default on a GPU: where the runs will train
        compile = compiles_by_default(check_runnable(name, target.train.dtype, False, where))
    run_device = check_runnable(name, target.train.dtype, compile, where)  # before anything is written
    dataset = load_data(data)  # a bad --data is refused here, not by the first run's process
    if target.train.batch_size % nproc:
        raise UsageError(f"--nproc {nproc} does not divide the preset's global batch of {target.train.batch_size} "
                         "sequences")
    check_batch_split(target.train.batch_size, nproc, micro_batch)  # as every run would refuse it, after its folder
    if target.baseline.vocab_size < dataset.vocab_size:
        raise UsageError(f"preset {preset} has a vocabulary of {target.baseline.vocab_size}, below the data's "
                         f"{dataset.vocab_size}")
    options = LaunchOptions(preset=preset, data=data, tokens=budget, nproc=nproc, device=device, compile=compile,
                            micro_batch=micro_batch, checkpoint_every=checkpoint_every, threads=threads)
    train = target.train.with_(**({"tokens": budget} if budget else {}))
    check_enough_tokens(dataset, train.batch_size, train.seq_len)  # each run would refuse it after its folder
    if rounded := train.whole_steps_note():
        typer.echo(f"note: {rounded}", err=True)
    return Target(target, train, dataset, options, run_device)


@dataclass
class RerunBatch:
    """The runs one command makes at a target, and where they are recorded: what ``train_runs`` trains."""

    proxy: StudyData
    target: Target
    planned: list[PlannedRun]
    results: optuna.Study  # the re-run study at this target (nas.rerun.record.rerun_study)
    settings: RerunSettings
    storage: optuna.storages.BaseStorage  # the writable storage both studies live in


def open_batch(proxy: StudyData, target: Target, shapes: list[PlannedShape], seeds: int, runs: str | Path,
               storage: str, what: str) -> RerunBatch:
    """The planned runs of ``shapes`` x ``seeds`` and the re-run study they are recorded in (made when missing); a
    shape this machine cannot train (``runners.memory.check_fits``; ``what``: how the refusal names it, ``{rank}``
    its proxy rank) is refused first, before the study or a folder is made."""
    from nas.rerun.plan import RerunSettings, plan_runs
    from nas.rerun.record import rerun_study
    from nas.study.storage import make_storage
    from runners.memory import check_fits

    options, train = target.options, target.train
    for shape in shapes:
        if shape.transfer.ok:
            check_fits(shape.transfer.target, train, target.device, options.micro_batch or train.batch_size //
                       options.nproc, options.nproc, f"preset {target.preset.name}: " +
                       what.format(rank=shape.proxy_rank))

    settings = RerunSettings(proxy.name, proxy.identity, target.preset.name,
                             {**target.train.result_fields(), "seed": None}, target.dataset.fingerprint)
    runs_dir = output_folder(runs, "--runs")  # made at the first launch when missing
    planned = plan_runs(shapes, seeds, runs_dir, settings)
    variant = f"{target.train.tokens:,} tokens, data {target.options.data}"
    writable = make_storage(storage)
    plain = target.train.tokens == target.preset.train.tokens and target.options.data == "builtin"
    results = rerun_study(writable, settings, variant, {
        "nas:proxy_preset": proxy.preset, "nas:tokens": target.train.tokens, "nas:data": target.options.data},
        plain=plain)
    return RerunBatch(proxy, target, planned, results, settings, writable)


def train_runs(batch: RerunBatch) -> None:
    """Train every planned run not recorded yet, one after another, and record each (a run interrupted before is
    resumed from its checkpoint); one line a run with its loss and the time left. Ctrl-C: exit 130, what finished is
    recorded and the same command resumes; `kill -INT` and SIGTERM stop it the same way."""
    import time

    from nas.rerun.launch import launch, read_result
    from nas.rerun.record import record, recorded
    from nas.study.signals import interruptible, raise_if_stopped
    from nas.units import format_duration

    raise_if_stopped()  # a stop since `nas` started (nas.cli.main) whose exception an import swallowed
    interruptible()  # `kill -INT` stops a background job too (its SIGINT is ignored until now), and SIGTERM as Ctrl-C
    done = recorded(batch.results, batch.settings)
    started, trained = time.perf_counter(), 0
    left = sum((run.shape.proxy_key, run.seed) not in done for run in batch.planned)
    try:
        for i, run in enumerate(batch.planned, start=1):
            raise_if_stopped()  # a stop whose exception a finalizer swallowed (nas.study.signals) still stops here
            what = (f"[{i}/{len(batch.planned)}] {run.shape.role} (proxy rank {run.shape.proxy_rank}) "
                    f"{run.target.label()} seed {run.seed}")
            if (run.shape.proxy_key, run.seed) in done:
                typer.echo(f"{what}: recorded already", err=True)
                continue
            result = read_result(run.folder)
            if result is None:
                typer.echo(f"{what}: training in {run.folder}", err=True)
                code, result = launch(run, batch.target.options)
                if result is None or result.get("status") not in ("ok", "diverged"):
                    raise UsageError(stopped(what, code, run.folder))
            record(batch.results, run, result, list(batch.proxy.scores[run.shape.proxy_key].trials), batch.settings)
            trained += 1
            eta = (time.perf_counter() - started) / trained * (left - trained)
            loss = result.get("val_loss")
            said = f"val loss {loss:.4f}" if isinstance(loss, (int, float)) else f"no val loss ({result.get('status')})"
            typer.echo(f"{what}: {said}, {result.get('tokens_per_s') or 0:,.0f} tok/s"
                       + (f" | ETA {format_duration(eta)}" if left > trained else ""), err=True)
    except KeyboardInterrupt:
        typer.echo("interrupted: finished runs are recorded; re-run the same command to resume", err=True)
        raise typer.Exit(INTERRUPTED_EXIT_CODE) from None


MAX_COUNT = 1000  # shapes or seeds a command re-runs: each is a training at a longer budget than the proxy's


def check_counts(*given: tuple[str, int]) -> None:
    """``UsageError`` for a count of shapes or seeds outside 1-``MAX_COUNT`` (``--seeds 100000000`` planned a
    hundred million runs in memory before it printed anything)."""
    for flag, value in given:
        if not 1 <= value <= MAX_COUNT:
            raise UsageError(f"{flag} {value} is invalid: give 1-{MAX_COUNT:,} (each is a training run)")


def stopped(what: str, code: int, folder: Path) -> str:
    """Why a launched run ended without a result, and what helps: its own refusal (exit 2, the line above it says
    why: the same command would meet it again), or a stop that the same command resumes from the run's log."""
    if code == 2:
        return (f"{what}: nas train refused it (exit code 2, the line above says why); fix that, then run the same "
                "command")
    log = folder / "log.jsonl"
    see = f"; see {log}" if log.exists() else ""
    return f"{what} stopped with exit code {code}{see}; run the same command to resume it"


@app.command()
def rerun(
    preset: Annotated[str, typer.Option("--preset", help="The target: see `nas presets` (e.g. cpu-long, "
                                        "gpt2-124m).")],
    study_name: StudyOpt = None,
    storage: StorageOpt = DEFAULT_STORAGE,
    top: Annotated[int, typer.Option("--top", help="How many of the proxy's best shapes, 1-1,000 (the baseline is "
                                     "always re-run).")] = 8,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per shape (0, 1, ...), 1-1,000.")] = 1,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens per run, e.g. 2.5B (default "
                                               "the preset's).", show_default=False)] = None,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes per run: torchrun --nproc-per-node N (DDP: "
                                       "NCCL on GPUs, gloo on CPUs).")] = 1,
    data: Annotated[str, typer.Option("--data", help="As for nas search (FineWeb .bin shards for the GPU "
                                      "presets).")] = "builtin",
    runs: Annotated[str, typer.Option("--runs", help="Folder of the runs' checkpoints, logs and results.")]
    = "runs",
    device: Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or mps (default the "
                                               "preset's).", show_default=False)] = None,
    compile: Annotated[bool | None, typer.Option("--compile/--no-compile", help="torch.compile each run "
                                                 "(default: on a GPU, not on a CPU).", show_default=False)] = None,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per forward per process (0: its "
                                             "whole share of the global batch).")] = 0,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Steps between checkpoints (0: "
                                                  "about every 10 % of a run).")] = 0,
    threads: Annotated[int, typer.Option("--threads", help="Torch threads per process (0: cores / processes).")]
    = 0,
) -> None:
    """Re-run the top shapes and the baseline at a target preset, one run after another, and write the results
    beside the study (nas report then shows proxy rank against full rank). The same command skips finished runs
    and resumes unfinished ones."""
    from nas.rerun.plan import plan_shapes
    from nas.stats.comparisons import kendall_tau
    from nas.study.existing import open_existing_study
    from reports.frame import read_study
    from reports.reruns import board_ranks, read_reruns

    check_counts(("--top", top), ("--seeds", seeds))
    target = check_target(preset, tokens, data, nproc, device, compile, micro_batch, checkpoint_every, threads)
    study, _ = open_existing_study(storage, study_name)
    proxy = read_study(study)
    shapes = plan_shapes(proxy_ranking(proxy), target.preset, top)
    for shape in shapes:
        if not shape.transfer.ok:
            typer.echo(f"skipped rank {shape.proxy_rank} ({shape.proxy_key}): {shape.transfer.refused}", err=True)
    batch = open_batch(proxy, target, shapes, seeds, runs, storage, "training rank {rank} as")
    train_runs(batch)
    reruns = read_reruns(batch.storage, proxy.name)
    label = batch.results.user_attrs["nas:rerun_label"]
    full = {} if reruns is None else {
        key: list(group["val_loss"]) for key, group in reruns[reruns["preset"] == label].groupby("proxy_key")}
    agreement = kendall_tau(board_ranks(proxy), full)
    if agreement is not None:
        typer.echo(f"proxy -> {label}: {agreement.text()}", err=True)
    typer.echo(f"done. Next: nas report --study-name {shlex.quote(proxy.name)} --storage "
               f"{shlex.quote(display_url(storage))} -o report.html{hidden_password_note(storage)}",
               err=True)
