"""The reference panel: the truth a proxy is judged against, kept in the repository as data.

    python -m benchmarks.reference_panel                 # about 30 min on 2 cores; writes REFERENCE_FILE
    python -m benchmarks.reference_panel --smoke --out /tmp/panel.json   # seconds: tiny shapes, few tokens

Thirteen shapes of the default ``cpu`` proxy's Prism space (the baseline and ``PANEL``: twelve
schedules over two to four plateaus with narrow and wide first layers), four seeds each, trained
with ``cpu-long``'s setup: 8x the proxy's tokens (262k), every run's windows spread over the whole
training split (``nas.data.BatchSampler``, as the proxy and full runs draw them), scored on the
weight average over 8,192 validation tokens spread over the validation split (8x the proxy's).
Runs go two at a time, one core and one thread each.

The file holds every run's final loss and curves, the commit, machine and date it came from, and
the panel's own quality (``panel_quality``): the pooled seed sd of a shape's score, the paired sd
against the baseline, the spread of the shapes' true means, and Kendall tau between the shape
means of its two halves of seeds (0-1 against 2-3) with a bootstrap interval over seeds. A
panel whose halves disagree ranks nothing, and no proxy can be shown to agree with it.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REFERENCE_FILE = Path(__file__).parent / "data" / "reference_panel.json"
PANEL = ("1x4,12x8", "2x4,12x8", "4x2,12x10", "8x4,12x8", "1x2,4x4,12x6", "2x3,3x3,12x6", "3x2,8x2,12x8",
         "6x2,8x3,12x7", "2x2,8x4,12x6", "1x2,2x2,4x2,12x6", "2x2,3x2,6x2,12x6", "3x2,4x2,8x2,12x6")
SEEDS = (0, 1, 2, 3)
EVAL_TOKENS = 8_192
SMOKE_PANEL = ("1x2,4x2", "2x2,4x2")


def parse_schedule(text: str) -> tuple[int, ...]:
    """``"1x2,4x4,12x6"`` -> ``(1, 1, 4, 4, 4, 4, 12, 12, 12, 12, 12, 12)``."""
    heads: list[int] = []
    for part in text.split(","):
        count, length = part.split("x")
        heads += [int(count)] * int(length)
    return tuple(heads)


def panel_shapes(smoke: bool = False) -> list[Any]:
    """The baseline and the panel's schedules as ``ArchConfig``s, each checked to be a member of the space."""
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space

    preset = get_preset("tiny" if smoke else "cpu")
    space = build_space(SpaceOptions(space="prism"), defaults=preset.baseline)
    base = space.baseline()
    shapes = [base] + [base.replace(heads=list(parse_schedule(s))) for s in (SMOKE_PANEL if smoke else PANEL)]
    for arch in shapes:
        problems = space.validate(arch)
        assert not problems, (arch.label(), problems)
    return shapes


def panel_train(smoke: bool = False) -> Any:
    from runners.presets import get_preset

    if smoke:
        return get_preset("tiny").train.with_(tokens=1_024, threads=1)
    return get_preset("cpu-long").train.with_(eval_tokens=EVAL_TOKENS, threads=1)


def _train_one(job: tuple[dict, dict, int, str | None, int]) -> dict[str, Any]:
    """One run in a worker process pinned to one core: the shape's final loss, curves and time."""
    arch_dict, train_dict, seed, cache_dir, core = job
    if hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[core % len(cores)]})
    from nas.arch import ArchConfig
    from nas.data import load_data
    from runners.config import TrainConfig
    from runners.proxy import run

    arch, cfg = ArchConfig.from_dict(arch_dict), TrainConfig.from_dict(train_dict).with_(seed=seed)
    result = run(arch, cfg, load_data("builtin", cache_dir=cache_dir))
    return {"key": arch.key(), "heads": list(arch.heads), "seed": seed, "status": result.status,
            "val_loss": result.val_loss, "eval_curve": [list(p) for p in result.eval_curve],
            "train_curve": [list(p) for p in result.train_curve], "wall_time_s": result.wall_time_s,
            "tokens_per_s": result.tokens_per_s}


def train_runs(shapes: list[Any], train: Any, seeds: tuple[int, ...], cache_dir: str | None = None,
               processes: int = 2, progress: bool = True) -> list[dict[str, Any]]:
    """Every (shape, seed) of the panel, ``processes`` at a time (one core each), in a fixed order."""
    jobs = [(arch.to_dict(), train.to_dict(), seed, cache_dir, i % processes)
            for i, (seed, arch) in enumerate((seed, arch) for seed in seeds for arch in shapes)]
    started, runs = time.perf_counter(), []
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes, maxtasksperchild=8) as pool:
        for run in pool.imap(_train_one, jobs):
            runs.append(run)
            if progress:
                elapsed = time.perf_counter() - started
                print(f"[{len(runs)}/{len(jobs)}] seed {run['seed']} {run['key']}: {run['val_loss']:.4f} "
                      f"({run['wall_time_s']:.0f} s; ETA {elapsed / len(runs) * (len(jobs) - len(runs)) / 60:.0f} "
                      "min)", file=sys.stderr, flush=True)
    return runs


def losses_by_shape(runs: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """``{shape key: {seed: final loss}}`` of the runs that finished."""
    table: dict[str, dict[int, float]] = {}
    for run in runs:
        if run["status"] == "ok" and run["val_loss"] is not None and math.isfinite(run["val_loss"]):
            table.setdefault(run["key"], {})[int(run["seed"])] = float(run["val_loss"])
    return table


def _tau(a: list[float], b: list[float]) -> float:
    from scipy import stats

    value = stats.kendalltau(a, b).statistic
    return 0.0 if value is None or math.isnan(value) else float(value)


def noise(table: dict[str, dict[int, float]], baseline: str) -> dict[str, float]:
    """Seed sd (pooled within shapes), paired sd (against the baseline, pooled), true-mean spread, separation."""
    seeds = sorted(set.intersection(*(set(v) for v in table.values())))
    within = [statistics.variance([v[s] for s in seeds]) for v in table.values()]
    diffs = [[table[baseline][s] - v[s] for s in seeds] for k, v in table.items() if k != baseline]
    seed_sd = math.sqrt(statistics.fmean(within))
    paired_sd = math.sqrt(statistics.fmean(statistics.variance(d) for d in diffs))
    means = [statistics.fmean(v[s] for s in seeds) for v in table.values()]
    spread = math.sqrt(max(0.0, statistics.variance(means) - paired_sd**2 / (2 * len(seeds))))
    return {"seeds": len(seeds), "seed_sd": seed_sd, "paired_sd": paired_sd, "true_mean_spread": spread,
            "separation": spread / paired_sd if paired_sd else math.inf}


def halves_tau(table: dict[str, dict[int, float]], resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """Kendall tau between shape means over the first and the second half of the seeds, with a bootstrap
    interval (each resample draws every shape's seeds within each half with replacement)."""
    seeds = sorted(set.intersection(*(set(v) for v in table.values())))
    first, second = seeds[:len(seeds) // 2], seeds[len(seeds) // 2:]
    keys = sorted(table)
    tau = _tau([statistics.fmean(table[k][s] for s in first) for k in keys],
               [statistics.fmean(table[k][s] for s in second) for k in keys])
    rng = random.Random(seed)
    draws = sorted(_tau([statistics.fmean(table[k][s] for s in rng.choices(first, k=len(first))) for k in keys],
                        [statistics.fmean(table[k][s] for s in rng.choices(second, k=len(second))) for k in keys])
                   for _ in range(resamples))
    return {"tau": tau, "low": draws[int(0.025 * resamples)], "high": draws[int(0.975 * resamples) - 1],
            "first_half": first, "second_half": second}


def split_tau(table: dict[str, dict[int, float]]) -> float:
    """Kendall tau between shape means over two halves of the common seeds, averaged over every balanced split
    (a steadier figure than one split: ``halves_tau``'s point estimate is one of these). Near 0: the shapes'
    mean scores at this many seeds do not reproduce, so nothing is ranked; 1: the ranking is the seeds'."""
    from itertools import combinations

    seeds = sorted(set.intersection(*(set(v) for v in table.values())))
    keys, half = sorted(table), len(seeds) // 2
    taus = []
    for first in combinations(seeds[:2 * half], half):
        second = [s for s in seeds[:2 * half] if s not in first]
        taus.append(_tau([statistics.fmean(table[k][s] for s in first) for k in keys],
                         [statistics.fmean(table[k][s] for s in second) for k in keys]))
    return statistics.fmean(taus)


def panel_quality(runs: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    table = losses_by_shape(runs)
    return {**noise(table, baseline), "halves_kendall_tau": halves_tau(table), "split_tau": split_tau(table)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def build_panel(smoke: bool = False, cache_dir: str | None = None, processes: int = 2) -> dict[str, Any]:
    import torch

    from benchmarks.harness import machine_info

    shapes, train = panel_shapes(smoke), panel_train(smoke)
    seeds = SEEDS[:2] if smoke else SEEDS
    started = time.perf_counter()
    runs = train_runs(shapes, train, seeds, cache_dir, processes)
    return {
        "what": "reference panel: the baseline and Prism schedules of the cpu proxy's space, 8x the proxy's tokens",
        "made": {"commit": _commit(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": {**machine_info(1, "cpu"), "platform": platform.platform(), "torch": torch.__version__},
                 "wall_time_s": time.perf_counter() - started, "processes": processes,
                 "command": "python -m benchmarks.reference_panel" + (" --smoke" if smoke else "")},
        "train": train.to_dict(), "data": "builtin", "baseline": shapes[0].key(),
        "shapes": [{"key": a.key(), "heads": list(a.heads), "label": a.label()} for a in shapes],
        "seeds": list(seeds), "runs": runs, "quality": panel_quality(runs, shapes[0].key()),
    }


def load_panel(path: Path = REFERENCE_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reference_panel", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and tokens: checks the code (seconds)")
    parser.add_argument("--out", type=Path, default=REFERENCE_FILE, help="the JSON file to write")
    parser.add_argument("--processes", type=int, default=2, help="runs at a time, one core each")
    parser.add_argument("--cache-dir", default=None, help="data cache (default $NAS_CACHE or the user cache)")
    args = parser.parse_args(argv)
    panel = build_panel(args.smoke, args.cache_dir, max(1, args.processes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(panel, indent=1) + "\n")
    q = panel["quality"]
    print(f"wrote {args.out}: {len(panel['runs'])} runs in {panel['made']['wall_time_s'] / 60:.1f} min; seed sd "
          f"{q['seed_sd']:.4f}, paired sd {q['paired_sd']:.4f}, spread {q['true_mean_spread']:.4f}, separation "
          f"{q['separation']:.2f}, halves tau {q['halves_kendall_tau']['tau']:+.2f} "
          f"[{q['halves_kendall_tau']['low']:+.2f}, {q['halves_kendall_tau']['high']:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
