"""``nas rerun``: train the proxy's best shapes and the baseline at a target preset and record them in the storage."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nas.cli.app import app
from nas.cli.options import StorageOpt, StudyOpt
from nas.errors import UsageError
from nas.files import output_folder
from nas.study.config import DEFAULT_STORAGE, display_url
from nas.units import parse_size

if TYPE_CHECKING:
    from nas.rerun.plan import ProxyRanking
    from reports.frame import StudyData


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
    top: Annotated[int, typer.Option("--top", help="How many of the proxy's best shapes (the baseline is "
                                     "always re-run).")] = 8,
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per shape (0, 1, ...).")] = 1,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Training tokens per run, e.g. 2.5B (default "
                                               "the preset's).", show_default=False)] = None,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes per run: torchrun --nproc-per-node N (DDP: "
                                       "NCCL on GPUs, gloo on CPUs).")] = 1,
    data: Annotated[str, typer.Option("--data", help="As for nas search (FineWeb .bin shards for the GPU "
                                      "presets).")] = "builtin",
    runs: Annotated[Path, typer.Option("--runs", help="Folder of the runs' checkpoints, logs and results.")]
    = Path("runs"),
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
    from nas.rerun.launch import LaunchOptions, launch, read_result
    from nas.rerun.plan import RerunSettings, plan_runs, plan_shapes
    from nas.rerun.record import record, recorded, rerun_study
    from nas.stats.comparisons import kendall_tau
    from nas.study.storage import make_storage, open_existing_study
    from reports.frame import read_study
    from reports.reruns import read_reruns
    from runners.presets import get_preset

    for flag, value in (("--top", top), ("--seeds", seeds), ("--nproc", nproc)):
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
    from runners.device import check_runnable, compiles_by_default

    name = device or target.train.device
    where = f"--device {device}" if device else f"preset {preset}"
    if compile is None:  # by default on a GPU: where the runs will train
        compile = compiles_by_default(check_runnable(name, target.train.dtype, False, where))
    run_device = check_runnable(name, target.train.dtype, compile, where)  # before anything is written
    from nas.data import load_data

    dataset = load_data(data)  # a bad --data is refused here, not by the first run's process
    if target.train.batch_size % nproc:
        raise UsageError(f"--nproc {nproc} does not divide the preset's global batch of {target.train.batch_size} "
                         "sequences")
    study, _ = open_existing_study(storage, study_name)
    proxy = read_study(study)
    shapes = plan_shapes(proxy_ranking(proxy), target, top)
    if target.baseline.vocab_size < dataset.vocab_size:
        raise UsageError(f"preset {preset} has a vocabulary of {target.baseline.vocab_size}, below the data's "
                         f"{dataset.vocab_size}")
    for shape in shapes:
        if not shape.transfer.ok:
            typer.echo(f"skipped rank {shape.proxy_rank} ({shape.proxy_key}): {shape.transfer.refused}", err=True)
    run_train = target.train.with_(**({"tokens": budget} if budget else {}))
    from runners.memory import check_fits

    for shape in shapes:  # a shape this machine cannot train is refused now, not by its run after the study is made
        if shape.transfer.ok:
            check_fits(shape.transfer.target, run_train, run_device, micro_batch or run_train.batch_size // nproc,
                       nproc, f"preset {preset}: training rank {shape.proxy_rank} as")
    settings = RerunSettings(proxy.name, proxy.identity, preset, {**run_train.result_fields(), "seed": None},
                             dataset.fingerprint)
    runs_dir = output_folder(runs, "--runs")  # made at the first launch when missing
    planned = plan_runs(shapes, seeds, runs_dir, settings)
    writable = make_storage(storage)
    variant = f"{run_train.tokens:,} tokens, data {data}"
    results = rerun_study(writable, settings, variant, {"nas:proxy_preset": proxy.preset,
                                                      "nas:tokens": run_train.tokens, "nas:data": data})
    done = recorded(results, settings)
    options = LaunchOptions(preset=preset, data=data, tokens=budget, nproc=nproc, device=device, compile=compile,
                            micro_batch=micro_batch, checkpoint_every=checkpoint_every, threads=threads)
    try:
        for i, run in enumerate(planned, start=1):
            what = (f"[{i}/{len(planned)}] {run.shape.role} (proxy rank {run.shape.proxy_rank}) "
                    f"{run.target.label()} seed {run.seed}")
            if (run.shape.proxy_key, run.seed) in done:
                typer.echo(f"{what}: recorded already", err=True)
                continue
            result = read_result(run.folder)
            if result is None:
                typer.echo(f"{what}: training in {run.folder}", err=True)
                code, result = launch(run, options)
                if result is None or result.get("status") not in ("ok", "diverged"):
                    raise UsageError(stopped(what, code, run.folder))
            record(results, run, result, list(proxy.scores[run.shape.proxy_key].trials), settings)
            typer.echo(f"{what}: val loss {result.get('val_loss')}, {result.get('tokens_per_s', 0):,.0f} tok/s",
                       err=True)
    except KeyboardInterrupt:
        typer.echo("interrupted: finished runs are recorded; re-run the same command to resume", err=True)
        raise typer.Exit(130) from None
    reruns = read_reruns(writable, proxy.name)
    label = results.user_attrs["nas:rerun_label"]
    full = {} if reruns is None else {
        key: list(group["val_loss"]) for key, group in reruns[reruns["preset"] == label].groupby("proxy_key")}
    agreement = kendall_tau({k: list(proxy.scores[k].losses) for k in full if k in proxy.scores}, full)
    if agreement is not None:
        typer.echo(f"proxy -> {label}: Kendall tau {agreement.tau:+.2f} (95 % bootstrap interval "
                   f"[{agreement.low:+.2f}, {agreement.high:+.2f}], {agreement.n_shapes} shapes); top-"
                   f"{agreement.top_k} overlap {agreement.top_overlap}", err=True)
    typer.echo(f"done. Next: nas report --study-name {shlex.quote(proxy.name)} --storage "
               f"{shlex.quote(display_url(storage))} -o report.html",
               err=True)
