"""Which local worker layout trains the most trials per minute: ``--workers 1`` with every core, or one per core.

    python -m benchmarks.worker_layout               # about 4 minutes on 2 cores
    python -m benchmarks.worker_layout --smoke       # the tiny preset: checks the code

Real ``nas search`` commands on the default proxy (``cpu`` preset, the Prism space), each on a fresh
SQLite file, the layouts alternated (A B A B) so that drifting machine speed falls on both: ``1 x
cores`` (one worker, torch threads = cores) against ``cores x 1`` (one worker per core, one thread
each). Throughput is trained trials per minute between the first trial's start and the last one's
end, read from the study (start-up excluded: it is paid once per search). ``--workers auto`` takes
the faster one (``nas.study.placement``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
from optuna.trial import TrialState


def trials_per_minute(storage: str, name: str) -> float:
    trials = [t for t in optuna.load_study(study_name=name, storage=storage).get_trials()
              if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
    start = min(t.datetime_start for t in trials)
    end = max(t.datetime_complete for t in trials)
    return 60 * len(trials) / (end - start).total_seconds()


def measure(workers: int, threads: int, trials: int, preset: str, folder: Path, index: int) -> float:
    storage = f"sqlite:///{folder / f'layout{index}.db'}"
    name = f"layout-{index}"
    subprocess.run([sys.executable, "-m", "nas.cli", "search", "--space", "prism", "--preset", preset, "--trials",
                    str(trials), "--workers", str(workers), "--threads", str(threads), "--storage", storage,
                    "--study-name", name], check=True, capture_output=True, text=True, timeout=1800)
    return trials_per_minute(storage, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worker_layout", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    layouts = {f"1 x {cores}": (1, cores), f"{cores} x 1": (cores, 1)}
    preset, trials = ("tiny", 4) if args.smoke else ("cpu", args.trials)
    rates: dict[str, list[float]] = {name: [] for name in layouts}
    with tempfile.TemporaryDirectory() as folder:
        index = 0
        for _ in range(1 if args.smoke else args.repeats):
            for name, (workers, threads) in layouts.items():
                rates[name].append(measure(workers, threads, trials, preset, Path(folder), index))
                index += 1
    single, split = (statistics.median(rates[name]) for name in layouts)
    for name, values in rates.items():
        print(f"{name:>8} (workers x threads): {statistics.median(values):.2f} trials/min {values}")
    print(f"{cores} x 1 over 1 x {cores}: {split / single:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
