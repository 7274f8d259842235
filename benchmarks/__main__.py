"""``python -m benchmarks [--smoke] [--only 1,2,...] [--out DIR] [--threads N] [--device cpu|cuda]``.

The process re-executes itself once with ``harness.ENV_DEFAULTS`` (glibc allocator settings;
they only act at start-up) unless they are already set or ``--no-reexec`` is given.
Exit status: 0 when every figure with a target met it (or ``--smoke``), 1 otherwise, 2 for bad
options. ``nas bench`` runs the same entry point.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import shlex
import signal
import sys
import time
import traceback

from benchmarks import FIGURES, LONG
from benchmarks.harness import BenchConfig, Figure, machine_info, reexec_with_env, set_threads, verdict, write_outputs
from nas.errors import UsageError
from nas.files import OutputFile, output_folder


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps per benchmark: checks the harness, "
                        "measures nothing (< 60 s)")
    parser.add_argument("--only", default=None, help="comma-separated figure numbers or names, e.g. 1,2 or vs_hf")
    parser.add_argument("--out", default="bench-out", help="folder for benchmarks.md and benchmarks.json")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every usable core)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (figures 1-4 then run in bf16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="data cache (default: $NAS_CACHE or the user cache)")
    parser.add_argument("--no-reexec", action="store_true", help="do not restart with the allocator/OpenMP settings")
    return parser.parse_args(argv)


def selected(only: str | None, smoke: bool = False) -> list[tuple[int, str]]:
    """The figures ``--only`` names; all but the long ones without it (all of them with ``--smoke``)."""
    figures = list(enumerate(FIGURES, start=1))
    if only is None:
        return figures if smoke else [(n, name) for n, name in figures if name not in LONG]
    wanted = {w.strip() for w in only.split(",") if w.strip()}
    if not wanted:  # `--only ""` ran every figure, and `--only ,,` crashed after running none
        raise UsageError(f"--only {only!r} names no figure; choose 1-{len(FIGURES)} or {', '.join(FIGURES)}, "
                         "or leave --only out for all")
    chosen = [(n, name) for n, name in figures if str(n) in wanted or name in wanted]
    unknown = wanted - {str(n) for n, _ in chosen} - {name for _, name in chosen}
    if unknown:
        raise UsageError(f"unknown figure(s) {', '.join(sorted(unknown))}; "
                         f"choose 1-{len(FIGURES)} or {', '.join(FIGURES)}")
    return chosen


# what a figure needs beyond prism-nas itself: the `bench` extra (pip install -e ".[bench]")
REQUIRES = {"vs_hf": ("transformers",)}


def check_requirements(chosen: list[tuple[int, str]]) -> None:
    """``UsageError`` naming the extra when a chosen figure needs a package that is not installed."""
    for number, name in chosen:
        missing = [m for m in REQUIRES.get(name, ()) if importlib.util.find_spec(m) is None]
        if missing:
            others = ",".join(str(n) for n, other in chosen if other != name) or "another figure"
            raise UsageError(f"figure {number} ({name}) needs the Python package {missing[0]!r}: "
                             f"pip install -e '.[bench]' (or leave it out: --only {others})")


def check_out_folder(out: str) -> None:
    """``--out`` is a folder that exists or can be made, and its two files can be written (``UsageError``)."""
    folder = output_folder(out, "--out")
    for name in ("benchmarks.md", "benchmarks.json"):
        if (folder / name).exists():
            OutputFile.of(folder / name, "--out")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        chosen = selected(args.only, args.smoke)
        check_requirements(chosen)
        if args.threads < 0 or args.device not in ("cpu", "cuda"):
            raise UsageError(f"--threads {args.threads} / --device {args.device!r} is invalid: threads >= 0 "
                             "(0 = every usable core), device cpu or cuda")
        from runners.device import check_runnable  # torch: after the checks that need none

        check_runnable(args.device, "fp32", compiling=False, what=f"--device {args.device}")  # a traceback per figure
        check_out_folder(args.out)  # before the first figure runs, not after it
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.no_reexec:
        reexec_with_env("benchmarks", argv)
    threads = set_threads(args.threads)
    cfg = BenchConfig(smoke=args.smoke, threads=threads, device=args.device, seed=args.seed, cache_dir=args.cache_dir)
    info = machine_info(threads, args.device)
    command = "python -m benchmarks " + shlex.join(argv) if argv else "python -m benchmarks"
    figures: list[Figure] = []
    started = time.perf_counter()
    try:
        return run_figures(chosen, cfg, args, info, command, figures, started)
    except KeyboardInterrupt:  # Ctrl-C, kill -INT: one line, as every command stops (a traceback before)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second one while the figure's pool winds down: the same stop
        kept = (f"the {len(figures)} figure{'s' if len(figures) > 1 else ''} finished before it "
                f"{'are' if len(figures) > 1 else 'is'} in {args.out}"
                if figures else "no figure had finished: nothing was written")
        print(f"interrupted: {kept}; run the same command again for the rest", file=sys.stderr)
        return 130


def run_figures(chosen: list[tuple[int, str]], cfg: BenchConfig, args: argparse.Namespace, info: dict,
                command: str, figures: list[Figure], started: float) -> int:
    """Run each chosen figure, writing the outputs after every one (a long run keeps its results); the exit code."""
    for number, name in chosen:
        t0 = time.perf_counter()
        print(f"[{number}/{len(FIGURES)}] {name} ...", flush=True)
        try:
            figure = importlib.import_module(f"benchmarks.{name}").run(cfg)
        except Exception as error:  # noqa: BLE001 - one broken figure must not hide the others
            traceback.print_exc()
            figure = Figure(number=number, name=name, title=name, target="-", method="crashed", columns=[],
                            passed=False, summary=f"error: {type(error).__name__}: {error}"[:300],
                            seconds=time.perf_counter() - t0, smoke=args.smoke)
        figures.append(figure)
        print(f"      {verdict(figure.passed, figure.smoke)}: {figure.summary} ({figure.seconds:.0f} s)", flush=True)
        set_threads(args.threads)  # a figure that ran the proxy may have changed it
        info["total_seconds"] = round(time.perf_counter() - started, 1)
        md, js = write_outputs(args.out, figures, info, command)  # after every figure: a long run keeps its results
    print(f"wrote {md} and {js} ({info['total_seconds']:.0f} s)")
    if args.smoke:
        return 0 if all(f.method != "crashed" for f in figures) else 1
    return 0 if all(f.passed is not False for f in figures) else 1


if __name__ == "__main__":
    # `kill -INT` stops a run started with SIGINT ignored (a shell's background job, a test runner's worker), as it
    # stops every `nas` command (nas.cli.main): Python keeps an inherited SIG_IGN, and the run went on to its end
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
