"""``nas version``, ``nas presets``, ``nas dashboard`` and ``nas bench``: the commands around a search."""

from __future__ import annotations

import errno
import sys
from typing import TYPE_CHECKING, Annotated

import typer

import nas
from nas.cli.app import app
from nas.cli.options import StorageOpt, choices
from nas.errors import INTERRUPTED_EXIT_CODE, UsageError
from nas.study.config import DEFAULT_STORAGE, display_url

if TYPE_CHECKING:
    from runners.presets import Preset

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")  # the dashboard listens on this machine only

BenchDevice = choices("BenchDevice", ("cpu", "cuda"))


@app.command()
def version() -> None:
    """Print the prism-nas version and the versions of its main libraries."""
    import optuna
    import torch

    typer.echo(f"prism-nas {nas.__version__} (torch {torch.__version__}, optuna {optuna.__version__}, "
               f"python {sys.version.split()[0]})")


@app.command()
def presets() -> None:
    """List the proxy and full-scale presets: baseline shape, exact parameter count and training budget."""
    from runners.presets import PRESETS

    for p in PRESETS.values():
        b, t = p.baseline, p.train
        typer.echo(f"{p.name:<15} L{b.n_layers} d{b.d_model} h{b.heads[0]} V{b.vocab_size} ffn{b.ffn.hidden} "
                   f"({b.n_params()['total']:,} params) | {t.tokens:,} tokens, B{t.batch_size} T{t.seq_len}, "
                   f"lr {t.lr:g}, {t.device}/{t.dtype}{', compiled' if t.compile else ''} | {p.description}")
        if p.gpu is not None:
            typer.echo("    " + gpu_arithmetic(p))


def gpu_arithmetic(preset: Preset) -> str:
    """The cost and predicted resolution of a GPU proxy preset, as ``nas presets`` states it."""
    import math
    from dataclasses import replace

    from nas.stats.resolution import detectable_gain
    from search_spaces.factory import SpaceOptions, build_space

    b, t, g = preset.baseline, preset.train, preset.gpu
    space = "joint" if "joint" in preset.name else "hourglass" if "hourglass" in preset.name else "prism"
    options = preset.space_options(SpaceOptions(space=space))
    members = build_space(options, defaults=b).count()
    minutes = g.minutes_per_trial(b, t)
    walk = (f"the {members}-member {space} walk {members * minutes / 60:.1f} h on 1 GPU, "
            f"{members * minutes / 60 / 8:.1f} h on 8" if space != "joint" else
            f"the {members}-member joint space is sampled: 200 trials {200 * minutes / 60:.1f} h on 1 GPU, "
            f"{200 * minutes / 60 / 8:.1f} h on 8")
    paired_sd, seeds, race = math.sqrt(2) * g.seed_sd, 8, 8  # independent seeds: the pairing's worst case
    gain = detectable_gain(paired_sd, seeds, 0.05 / race)
    flash = ""
    if options.max_head_dim is not None:  # what the preset's head-dim cap leaves out of the Prism space
        prism = replace(preset.space_options(SpaceOptions(space="prism")), kv_groups=None)  # schedules, not GQA
        capped = build_space(prism, defaults=b).count()
        every = build_space(SpaceOptions(space="prism"), defaults=b).count()
        flash = (f"; --max-head-dim {options.max_head_dim} (default here) keeps the {capped} of {every} Prism "
                 f"schedules whose head dims FlashAttention takes ({every - capped} have a layer above "
                 f"{options.max_head_dim}, where SDPA falls back to its memory-efficient kernel and tokens/s "
                 "would differ for kernel reasons; benchmarks/gpu_check.py times both)")
    if options.kv_groups is not None:  # what the grouped key/value heads save an inference
        flash += (f"; KV cache {b.kv_cache_bytes_per_token():,} bytes/token at the baseline, "
                  + ", ".join(f"{b.kv_cache_bytes_per_token() // group:,} at group size {group}"
                              for group in options.kv_groups))
    return (f"{b.flops_per_token(t.seq_len) / 1e9:.3f} GFLOP/token (ArchConfig.flops_per_token, T={t.seq_len}) at "
            f"{g.achieved_flops / 1e12:.0f} TFLOP/s ({100 * g.mfu:.0f} % MFU of the "
            f"{g.peak_flops / 1e12:.0f} TFLOP/s H100/H200 bf16 datasheet peak; a run's MFU is against the matmul "
            f"peak it measures, which reads higher) and a cold compile of {g.compile_s:.0f} s a schedule (both "
            "measured on one H200 by benchmarks/gpu_check.py; yours: run it): "
            f"{g.tokens_per_s(b, t) / 1e3:.0f}k tokens/s, {minutes:.1f} min a trial; {walk} "
            f"(--workers auto); from a seed sd of {g.seed_sd} nats (modded-nanogpt, GPT-2 small), paired sd at most "
            f"{paired_sd:.4f}: a race of {race} over {seeds} paired seeds detects {gain:.4f} nats "
            f"({100 * gain / 3.28:.2f} % of a 3.28 loss; Prism's effect at 124M: 0.43 %){flash}")


@app.command()
def dashboard(
    storage: StorageOpt = DEFAULT_STORAGE,
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on (127.0.0.1: this machine only).")]
    = "127.0.0.1",
) -> None:
    """Serve optuna-dashboard for the storage (live view of running studies); the storage must be one a search has
    made (a missing or empty file is refused, as by `nas best`). Ctrl-C stops it (exit 130)."""
    from optuna_dashboard import wsgi

    from nas.cli.serving import serve_until_interrupted
    from nas.study.storage import make_storage

    if not 0 < port < 65536:
        raise UsageError(f"--port {port} is invalid: use 1-65535")
    # refused as every reader refuses it: a mistyped file name, an empty file or another program's database, which
    # opening it to write would have turned into an Optuna storage; the dashboard itself may write (notes)
    make_storage(storage, read_only=True).engine.dispose()
    check_port_free(host, port)
    store = make_storage(storage)
    typer.echo(f"optuna-dashboard for {display_url(storage)} on http://{host}:{port}/ (Ctrl-C stops)", err=True)
    if host not in LOCAL_HOSTS:
        typer.echo(f"warning: --host {host} makes the dashboard reachable from other machines; it has no login, and "
                   "whoever reaches port {port} can read and edit every study in this storage".replace(
                       "{port}", str(port)), err=True)
    if not serve_until_interrupted(wsgi(store), host, port):
        typer.echo(f"error: the dashboard's server on {host}:{port} stopped by itself (its error is above)", err=True)
        raise typer.Exit(1)
    # a stop ends it (nas.cli.serving): exit as every other command does on Ctrl-C or `kill -INT`
    typer.echo("stopped: the dashboard is closed; the study is as the searches left it", err=True)
    raise typer.Exit(INTERRUPTED_EXIT_CODE)


def check_port_free(host: str, port: int) -> None:
    """``UsageError`` when ``host:port`` cannot be listened on (another server has it, or no such interface)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise UsageError(f"--host {host!r} is not an address of this machine: {error}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            busy = error.errno in (errno.EADDRINUSE, errno.EACCES)
            hint = "; another program has that port: choose another with --port" if busy else ""
            raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}{hint}") from None


@app.command()
def bench(
    smoke: Annotated[bool, typer.Option("--smoke", help="A few steps per figure: checks the harness, measures "
                                        "nothing (< 60 s).")] = False,
    only: Annotated[str | None, typer.Option("--only", help="Comma-separated figure numbers or names, e.g. 1,2 or "
                                             "vs_hf (default: all).", show_default=False)] = None,
    out: Annotated[str, typer.Option("--out", help="Folder for benchmarks.md and benchmarks.json.")] = "bench-out",
    threads: Annotated[int, typer.Option("--threads", help="Torch threads (0: every usable core).")] = 0,
    device: Annotated[BenchDevice, typer.Option("--device", help="cpu, or cuda (figures 1-4 then run in bf16).")]
    = BenchDevice.cpu,
    seed: Annotated[int, typer.Option("--seed", help="Seed of models and data.")] = 0,
    cache_dir: Annotated[str | None, typer.Option("--cache-dir", help="Data cache (default $NAS_CACHE or the "
                                                     "user cache).", show_default=False)] = None,
) -> None:
    """Measure the speed claims as same-run ratios (benchmarks/RESULTS.md): as `python -m benchmarks`."""
    from benchmarks.__main__ import main as bench_main

    argv = ["--out", out, "--threads", str(threads), "--device", device.value, "--seed", str(seed)]
    argv += ["--smoke"] * smoke + (["--only", only] if only is not None else [])
    argv += ["--cache-dir", cache_dir] if cache_dir else []
    raise typer.Exit(bench_main(argv))
