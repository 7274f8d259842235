"""``nas``: the command line. Commands parse and print; the work lives in library functions.

Every usage error is one line on stderr and exit code 2 (``nas.errors.UsageError``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

import nas
from nas.cli.space import fail, space_app, with_space_options
from nas.errors import UsageError
from search_spaces.factory import SpaceOptions

app = typer.Typer(help="prism-nas: search the shape of decoder-only Transformers (Prism head schedules, "
                       "Hourglass FFNs) with Optuna.", no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(space_app, name="space")

StorageOpt = Annotated[str, typer.Option("--storage", help="SQLAlchemy URL of the Optuna storage "
                                         "(PostgreSQL for many machines).")]
StudyOpt = Annotated[Optional[str], typer.Option("--study-name", help="Study name (default derived from space, "
                                                 "preset and options; printed).", show_default=False)]
FormatOpt = Annotated[str, typer.Option("--format", help="table or json.")]


def _usage(error: UsageError) -> typer.Exit:
    return fail(error)


@app.command()
def version() -> None:
    """Print the prism-nas version and the versions of its main libraries."""
    import optuna
    import torch

    typer.echo(f"prism-nas {nas.__version__} (torch {torch.__version__}, optuna {optuna.__version__}, "
               f"python {sys.version.split()[0]})")


@app.command()
def presets() -> None:
    """List the proxy and full-scale presets (baseline shape and training budget)."""
    from runners.presets import PRESETS

    for p in PRESETS.values():
        b, t = p.baseline, p.train
        typer.echo(f"{p.name:<15} L{b.n_layers} d{b.d_model} h{b.heads[0]} V{b.vocab_size} ffn{b.ffn.hidden} | "
                   f"{t.tokens} tokens, B{t.batch_size} T{t.seq_len}, lr {t.lr:g}, {t.device}/{t.dtype} | "
                   f"{p.description}")


def _train_overrides(**values: Any) -> tuple[tuple[str, Any], ...]:
    from nas.units import parse_size

    out = []
    for name, value in values.items():
        if value is None:
            continue
        if name == "tokens":
            value = parse_size(value, "--tokens")
        out.append((name, value))
    return tuple(out)


@app.command()
@with_space_options
def search(
    opts: SpaceOptions,
    trials: Annotated[int, typer.Option("--trials", help="Trained trials the study should hold (resumable).")] = 200,
    preset: Annotated[str, typer.Option("--preset", help="Proxy/target setup: see `nas presets`.")] = "cpu",
    data: Annotated[str, typer.Option("--data", help="builtin, a text file/dir/glob, a .npy token array, or a "
                                      "directory of llm.c .bin shards.")] = "builtin",
    storage: StorageOpt = "sqlite:///nas.db",
    study_name: StudyOpt = None,
    sampler: Annotated[Optional[str], typer.Option("--sampler", help="tpe, random, grid, gp or nsga2 "
                                                   "(default tpe; nsga2 with several objectives).",
                                                   show_default=False)] = None,
    pruner: Annotated[str, typer.Option("--pruner", help="median, hyperband or none.")] = "median",
    objectives: Annotated[str, typer.Option("--objectives", help="loss, loss,params or loss,tokens_per_s.")] = "loss",
    workers: Annotated[int, typer.Option("--workers", help="Worker processes on this machine.")] = 1,
    threads: Annotated[Optional[int], typer.Option("--threads", help="Torch threads per worker (default: the "
                                                   "usable cores / --workers). With several searches on one "
                                                   "machine, keep workers x threads <= cores.",
                                                   show_default=False)] = None,
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Training tokens per trial (e.g. 64k); "
                                                  "default the preset's.", show_default=False)] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Context length (default the preset's).",
                                                   show_default=False)] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per step (default the "
                                                      "preset's).", show_default=False)] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate (default the preset's).",
                                                show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Base seed of init, data order and sampler.",
                                                show_default=False)] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda or mps.",
                                                  show_default=False)] = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="fp32 or bf16.", show_default=False)] = None,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile", help="torch.compile each trial.",
                                                    show_default=False)] = None,
    replicate_top: Annotated[int, typer.Option("--replicate-top", help="After an exhaustive walk, seed "
                                               "replicates go to the baseline and this many best shapes.")] = 4,
    heartbeat: Annotated[int, typer.Option("--heartbeat", help="Seconds between trial heartbeats; a trial "
                                           "silent for 3x this is failed and re-queued.")] = 10,
) -> None:
    """Run (or resume) an Optuna study whose trials are short proxy trainings of shapes from the space."""
    from nas.study.config import SearchConfig, precheck

    try:
        config = SearchConfig(
            space=opts, preset=preset, data=data, storage=storage, study_name=study_name, trials=trials,
            sampler=sampler, pruner=pruner, objectives=tuple(o.strip() for o in objectives.split(",") if o.strip()),
            workers=workers, replicate_top=replicate_top, heartbeat_interval=heartbeat,
            train_overrides=_train_overrides(tokens=tokens, seq_len=seq_len, batch_size=batch_size, lr=lr,
                                             seed=seed, device=device, dtype=dtype, compile=compile,
                                             threads=threads))
        precheck(config)  # before torch is imported: a mistyped option is reported at once
    except UsageError as error:
        raise _usage(error) from None
    from nas.cli.progress import Progress
    from nas.study.parallel import interruptible, run_search
    from nas.study.worker import SearchAborted, trials_done

    interruptible()
    try:
        progress = Progress(workers)
        result = run_search(config, on_event=progress, on_start=progress.start)
    except UsageError as error:
        raise _usage(error) from None
    except SearchAborted as error:
        typer.echo(f"error: search stopped: {error}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("interrupted: the running trial is marked and re-queued; re-run the same command to resume",
                   err=True)
        raise typer.Exit(130) from None
    for note in result.notes:
        typer.echo(f"warning: {note}", err=True)
    name = result.config.study_name
    typer.echo(f"done: study {name!r} holds {trials_done(result.study)} trained trials. "
               f"Next: nas best --study-name {name} --storage {storage}", err=True)


def _load_study(storage: str, study_name: str | None):
    import optuna

    from nas.study.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = make_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    if study_name is None:
        if len(names) != 1:
            raise UsageError(f"give --study-name: {storage} holds {len(names)} studies"
                             + (f" ({', '.join(names)})" if names else ""))
        study_name = names[0]
    if study_name not in names:
        raise UsageError(f"no study {study_name!r} in {storage}; it holds: {', '.join(names) or 'none'}")
    return optuna.load_study(study_name=study_name, storage=store)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


@app.command()
def best(
    study_name: StudyOpt = None,
    storage: StorageOpt = "sqlite:///nas.db",
    top: Annotated[int, typer.Option("--top", help="How many shapes (the baseline is always shown).")] = 10,
    format: FormatOpt = "table",
) -> None:
    """The leaderboard: shape, mean loss ± 95% CI over seeds, gain over the baseline, parameters, tokens/s."""
    from reports.leaderboard import leaderboard

    if format not in ("table", "json"):
        raise _usage(UsageError(f"--format {format!r} is invalid: choose table or json"))
    if top < 1:
        raise _usage(UsageError(f"--top {top} is invalid: give at least 1"))
    try:
        study = _load_study(storage, study_name)
    except UsageError as error:
        raise _usage(error) from None
    board = leaderboard(study, top)
    if format == "json":
        rows = [{k: _jsonable(v) for k, v in row.items()} for row in board.to_dict(orient="records")]
        typer.echo(json.dumps(rows, indent=2))
        return
    if board.empty:
        typer.echo("no completed trials yet")
        return
    typer.echo(f"{'rank':>4}  {'heads':<28} {'K':>2} {'d_h':>5} {'d':>5} {'L':>3} {'seeds':>5}  "
               f"{'mean loss':>9} {'± ci95':>7} {'gain %':>7} {'params':>10} {'tok/s':>7}")
    for r in board.itertuples():
        ci = f"{r.ci95:.4f}" if r.ci95 is not None and not math.isnan(r.ci95) else "-"
        gain = f"{r.gain_pct:+.2f}" if r.gain_pct is not None and not math.isnan(r.gain_pct) else "-"
        tag = "  (baseline)" if r.is_baseline else ""
        typer.echo(f"{r.rank:>4}  {r.heads:<28} {r.k:>2} {r.d_h:>5} {r.d_model:>5} {r.layers:>3} {r.seeds:>5}  "
                   f"{r.mean_loss:>9.4f} {ci:>7} {gain:>7} {r.params:>10} {r.tokens_per_s:>7.0f}{tag}")


@app.command()
def dashboard(
    storage: StorageOpt = "sqlite:///nas.db",
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1.")] = 8080,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
) -> None:
    """Serve optuna-dashboard for the storage (live view of running studies)."""
    from optuna_dashboard import run_server

    from nas.study.storage import make_storage

    if not 0 < port < 65536:
        raise _usage(UsageError(f"--port {port} is invalid: use 1-65535"))
    try:
        store = make_storage(storage)
    except UsageError as error:
        raise _usage(error) from None
    typer.echo(f"optuna-dashboard for {storage} on http://{host}:{port}/ (Ctrl-C stops)", err=True)
    run_server(store, host=host, port=port)


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", help="ArchConfig JSON (as `nas best --format json` "
                                         "keys or an exported config).")],
    preset: Annotated[str, typer.Option("--preset", help="Training setup: see `nas presets`.")] = "cpu",
    data: Annotated[str, typer.Option("--data", help="As for nas search.")] = "builtin",
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Training tokens (default the preset's).",
                                                  show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of init and data order.")] = 0,
    device: Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda or mps.",
                                                  show_default=False)] = None,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the TrialResult JSON here "
                                                   "(default stdout).", show_default=False)] = None,
) -> None:
    """Train one shape once and print its result as JSON."""
    from nas.arch import ArchConfig
    from nas.data.loading import load_data
    from runners.presets import get_preset
    from runners.proxy import run

    try:
        if not config.is_file():
            raise UsageError(f"--config {str(config)!r} does not exist")
        try:
            arch = ArchConfig.from_json(config.read_text())
        except (json.JSONDecodeError, TypeError) as error:
            raise UsageError(f"--config {str(config)!r} is not an ArchConfig JSON: {error}") from None
        cfg = get_preset(preset).train.with_(**dict(_train_overrides(tokens=tokens, seed=seed, device=device)))
        dataset = load_data(data)
        if arch.vocab_size < dataset.vocab_size:
            raise UsageError(f"the config's vocab_size {arch.vocab_size} is below the data's {dataset.vocab_size}")
        result = run(arch, cfg, dataset)
    except UsageError as error:
        raise _usage(error) from None
    text = json.dumps({"arch": arch.to_dict(), "train": cfg.to_dict(), "result": result.to_dict()}, indent=2,
                      default=str)
    if output:
        output.write_text(text)
    else:
        typer.echo(text)
    if result.status != "ok":
        typer.echo(f"run ended {result.status}: {result.reason}", err=True)
        raise typer.Exit(1)


@app.command()
def bench(
    smoke: Annotated[bool, typer.Option("--smoke", help="A few steps per figure: checks the harness, measures "
                                        "nothing (< 60 s).")] = False,
    only: Annotated[str, typer.Option("--only", help="Comma-separated figure numbers or names, e.g. 1,2 or "
                                      "vs_hf (default: all 7).")] = "",
    out: Annotated[str, typer.Option("--out", help="Folder for benchmarks.md and benchmarks.json.")] = "bench-out",
    threads: Annotated[int, typer.Option("--threads", help="Torch threads (0: every usable core).")] = 0,
    device: Annotated[str, typer.Option("--device", help="cpu, or cuda (figures 1-4 then run in bf16).")] = "cpu",
    seed: Annotated[int, typer.Option("--seed", help="Seed of models and data.")] = 0,
    cache_dir: Annotated[Optional[str], typer.Option("--cache-dir", help="Data cache (default $NAS_CACHE or the "
                                                     "user cache).", show_default=False)] = None,
) -> None:
    """Measure the speed claims as same-run ratios (benchmarks/RESULTS.md): as `python -m benchmarks`."""
    from benchmarks.__main__ import main as bench_main

    argv = ["--out", out, "--threads", str(threads), "--device", device, "--seed", str(seed)]
    argv += ["--smoke"] * smoke + (["--only", only] if only else []) + (["--cache-dir", cache_dir] if cache_dir else [])
    raise typer.Exit(bench_main(argv))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
