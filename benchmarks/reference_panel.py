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

``--space hourglass`` builds the width-depth-FFN axis's panel the same way (``HOURGLASS_FILE``):
the conventional baseline and ``HOURGLASS_PANEL``, sixteen members of the ``cpu`` proxy's default
Hourglass grid (``nas space list --space hourglass``) spread over depth (2-24 layers at one
parameter budget, d_model / L from about 4 to 170), K (1-8) and d_h / d_model (0.2-1.0).

Runs are written to the file as they finish (``"complete": false`` until the last), and the same
command resumes from them: a cut-off run keeps what it had.
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
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REFERENCE_FILE = Path(__file__).parent / "data" / "reference_panel.json"
HOURGLASS_FILE = Path(__file__).parent / "data" / "reference_panel_hourglass.json"
PANEL = ("1x4,12x8", "2x4,12x8", "4x2,12x10", "8x4,12x8", "1x2,4x4,12x6", "2x3,3x3,12x6", "3x2,8x2,12x8",
         "6x2,8x3,12x7", "2x2,8x4,12x6", "1x2,2x2,4x2,12x6", "2x2,3x2,6x2,12x6", "3x2,4x2,8x2,12x6")
SEEDS = (0, 1, 2, 3)
EVAL_TOKENS = 8_192
SMOKE_PANEL = ("1x2,4x2", "2x2,4x2")
# grid points (K, L, d_h / d_model) of the cpu proxy's default Hourglass grid; each names the member solved from it
HOURGLASS_PANEL = ((1, 2, 0.5), (1, 3, 0.5), (1, 4, 0.5), (1, 6, 0.5), (1, 9, 0.5), (1, 12, 0.6), (1, 18, 0.6),
                   (1, 24, 0.6), (1, 6, 0.2), (1, 6, 1.0), (2, 3, 0.3), (2, 6, 0.4), (2, 12, 0.3), (4, 2, 0.3),
                   (4, 6, 0.3), (8, 6, 0.2))
SMOKE_HOURGLASS_PANEL = ((1, 2, 0.5), (2, 4, 0.3))
SPACES = ("prism", "hourglass")


def parse_schedule(text: str) -> tuple[int, ...]:
    """``"1x2,4x4,12x6"`` -> ``(1, 1, 4, 4, 4, 4, 12, 12, 12, 12, 12, 12)``."""
    heads: list[int] = []
    for part in text.split(","):
        count, length = part.split("x")
        heads += [int(count)] * int(length)
    return tuple(heads)


def panel_file(space: str) -> Path:
    return HOURGLASS_FILE if space == "hourglass" else REFERENCE_FILE


def panel_shapes(smoke: bool = False, space_name: str = "prism") -> list[Any]:
    """The baseline and the panel's shapes as ``ArchConfig``s, each checked to be a member of the space."""
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space
    from search_spaces.hourglass import GridPoint

    preset = get_preset("tiny" if smoke else "cpu")
    space = build_space(SpaceOptions(space=space_name), defaults=preset.baseline)
    base = space.baseline()
    if space_name == "hourglass":
        points = SMOKE_HOURGLASS_PANEL if smoke else HOURGLASS_PANEL
        shapes = [base] + [space.member_at(GridPoint(k, layers, ratio)) for k, layers, ratio in points]
    else:
        shapes = [base] + [base.replace(heads=list(parse_schedule(s))) for s in (SMOKE_PANEL if smoke else PANEL)]
    assert len({a.key() for a in shapes}) == len(shapes), "panel shapes must differ"
    for arch in shapes:
        problems = space.validate(arch)
        assert not problems, (arch.label(), problems)
    return shapes


def panel_train(smoke: bool = False) -> Any:
    from runners.presets import get_preset

    if smoke:
        return get_preset("tiny").train.with_(tokens=1_024, threads=1)
    return get_preset("cpu-long").train.with_(eval_tokens=EVAL_TOKENS, threads=1)


_CORE: int | None = None  # this worker process's core, taken once from the pool's queue (``_take_core``)


def _take_core(cores: Any) -> None:
    """Pool initializer: pin this worker process to one core for its whole life, so that two runs never share a
    core while another idles (pinning by job index did: a worker that finished early took the other's core)."""
    global _CORE
    _CORE = cores.get()
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {allowed[_CORE % len(allowed)]})


def _train_one(job: tuple[dict, dict, int, str | None]) -> dict[str, Any]:
    """One run in a worker process pinned to one core: the shape's final loss, curves and time."""
    arch_dict, train_dict, seed, cache_dir = job
    from nas.arch import ArchConfig
    from nas.data import load_data
    from runners.config import TrainConfig
    from runners.proxy import run

    arch, cfg = ArchConfig.from_dict(arch_dict), TrainConfig.from_dict(train_dict).with_(seed=seed)
    result = run(arch, cfg, load_data("builtin", cache_dir=cache_dir))
    return {"key": arch.key(), "label": arch.label(), "heads": list(arch.heads), "seed": seed,
            "status": result.status, "val_loss": result.val_loss, "eval_curve": [list(p) for p in result.eval_curve],
            "train_curve": [list(p) for p in result.train_curve], "wall_time_s": result.wall_time_s,
            "tokens_per_s": result.tokens_per_s}


def train_runs(shapes: list[Any], train: Any, seeds: tuple[int, ...], cache_dir: str | None = None,
               processes: int = 2, progress: bool = True, done: list[dict[str, Any]] | None = None,
               on_run: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Every (shape, seed) of the panel, ``processes`` at a time (one core each), in a fixed order.

    ``done``: runs already made (by key and seed), kept and not trained again; ``on_run`` is called with every
    run so far after each one finishes (to write them as they come)."""
    runs = list(done or [])
    have = {(r["key"], int(r["seed"])) for r in runs}
    jobs = [(arch.to_dict(), train.to_dict(), seed, cache_dir)
            for seed in seeds for arch in shapes if (arch.key(), seed) not in have]
    started, total, fresh = time.perf_counter(), len(runs) + len(jobs), 0
    if not jobs:
        return runs
    context = multiprocessing.get_context("spawn")
    cores = context.Queue()
    for core in range(processes):
        cores.put(core)
    with context.Pool(processes, initializer=_take_core, initargs=(cores,)) as pool:
        for run in pool.imap(_train_one, jobs):
            runs.append(run)
            fresh += 1
            if on_run is not None:
                on_run(runs)
            if progress:
                elapsed = time.perf_counter() - started
                print(f"[{len(runs)}/{total}] seed {run['seed']} {run['label']}: {run['val_loss']:.4f} "
                      f"({run['wall_time_s']:.0f} s; ETA {elapsed / fresh * (total - len(runs)) / 60:.0f} "
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


def panel_quality(runs: list[dict[str, Any]], baseline: str, shapes: list[dict[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """The panel's noise and self-agreement; with ``shapes`` (their records) the width-depth fit too."""
    table = losses_by_shape(runs)
    quality = {**noise(table, baseline), "halves_kendall_tau": halves_tau(table), "split_tau": split_tau(table)}
    if shapes is not None:
        quality["width_depth"] = width_depth(table, shapes)
    return quality


def width_depth(table: dict[str, dict[int, float]], shapes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The panel's optimum ``d_model / L`` (``reports.width_depth.fit_width_depth``: a weighted quadratic in
    ``log(d_model / L)`` over the shapes' seed means, its 95 % bootstrap interval over seeds), over every shape and
    over the ``K = 1`` shapes alone; None where fewer than three ratios were trained (a Prism panel: one ratio)."""
    from reports.width_depth import WidthDepthPoint, fit_width_depth

    def fitted(records: list[dict[str, Any]]) -> dict[str, Any] | None:
        points = [WidthDepthPoint(r["label"], r["d_model"] / r["n_layers"], tuple(table[r["key"]].values()))
                  for r in records if table.get(r["key"]) and r.get("d_model") and r.get("n_layers")]
        fit = fit_width_depth(points)
        if fit is None or fit.minimum is None:
            return None
        return {"optimum": fit.minimum, "low": fit.low, "high": fit.high, "shapes": fit.n_points,
                "ratio_range": list(fit.x_range), "inside": fit.minimum_inside}

    every = fitted(shapes)
    return None if every is None else {"all": every, "k1": fitted([r for r in shapes if r.get("k") == 1])}


def provenance() -> dict[str, Any]:
    """Where runs come from: the commit, the date (UTC) and the machine (``benchmarks.harness.machine_info``, its
    load average at the start included, and the platform)."""
    from benchmarks.harness import machine_info

    return {"commit": current_commit(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": {**machine_info(1, "cpu"), "platform": platform.platform()}}


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def shape_record(arch: Any) -> dict[str, Any]:
    return {"key": arch.key(), "label": arch.label(), "heads": list(arch.heads), "n_layers": arch.n_layers,
            "d_model": arch.d_model, "k": arch.ffn.k, "d_h": arch.ffn.hidden, "params": arch.n_params()["total"]}


def build_panel(smoke: bool = False, cache_dir: str | None = None, processes: int = 2, space: str = "prism",
                out: Path | None = None) -> dict[str, Any]:
    """Train (or finish) the panel; with ``out``, every run is written there as it finishes and runs already in an
    unfinished file of the same setup are kept."""
    shapes, train = panel_shapes(smoke, space), panel_train(smoke)
    seeds = SEEDS[:2] if smoke else SEEDS
    what = (f"reference panel: the baseline and {len(shapes) - 1} members of the cpu proxy's default Hourglass grid "
            "(one parameter budget), 8x the proxy's tokens" if space == "hourglass" else
            "reference panel: the baseline and Prism schedules of the cpu proxy's space, 8x the proxy's tokens")
    panel: dict[str, Any] = {
        "what": what, "space": space, "complete": False,
        "made": {**provenance(), "wall_time_s": 0.0, "processes": processes,
                 "command": "python -m benchmarks.reference_panel" + (f" --space {space}" if space != "prism" else "")
                 + (" --smoke" if smoke else "")},
        "train": train.to_dict(), "data": "builtin", "baseline": shapes[0].key(),
        "shapes": [shape_record(a) for a in shapes], "seeds": list(seeds), "runs": [],
    }
    done: list[dict[str, Any]] = []
    if out is not None and out.exists():
        stored = json.loads(out.read_text())
        if not stored.get("complete", True) and stored.get("train") == panel["train"] \
                and [s["key"] for s in stored.get("shapes", [])] == [a.key() for a in shapes]:
            done = stored["runs"]
            panel["made"]["wall_time_s"] = stored["made"].get("wall_time_s", 0.0)
            print(f"resuming {out}: {len(done)} runs kept", file=sys.stderr, flush=True)
    before, started = panel["made"]["wall_time_s"], time.perf_counter()

    def write(runs: list[dict[str, Any]]) -> None:
        panel["runs"] = runs
        panel["made"]["wall_time_s"] = before + time.perf_counter() - started
        if out is not None:
            _write_json(out, panel)

    runs = train_runs(shapes, train, seeds, cache_dir, processes, done=done, on_run=write)
    write(runs)
    panel["complete"] = True
    panel["quality"] = panel_quality(runs, shapes[0].key(), panel["shapes"])
    return panel


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a temporary file beside ``path``, then an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def load_panel(path: Path = REFERENCE_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reference_panel", description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=SPACES, default="prism", help="the axis: Prism schedules or the "
                        "Hourglass grid (width, depth, K, d_h/d_model)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and tokens: checks the code (seconds)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write (default: the space's file "
                        "in benchmarks/data)")
    parser.add_argument("--processes", type=int, default=2, help="runs at a time, one core each")
    parser.add_argument("--cache-dir", default=None, help="data cache (default $NAS_CACHE or the user cache)")
    parser.add_argument("--summary", action="store_true", help="train nothing: print the stored panel's quality "
                        "and width-depth optimum (read from --out or the space's file)")
    args = parser.parse_args(argv)
    out = args.out or panel_file(args.space)
    if args.summary:
        if not out.exists():
            print(f"error: no panel at {out}: run without --summary to train it", file=sys.stderr)
            return 2
        panel = load_panel(out)
        panel["quality"] = panel_quality(panel["runs"], panel["baseline"], panel["shapes"])
    else:
        panel = build_panel(args.smoke, args.cache_dir, max(1, args.processes), args.space, out)
        _write_json(out, panel)
    q = panel["quality"]
    print(f"{'read' if args.summary else 'wrote'} {out}: {len(panel['runs'])} runs in "
          f"{panel['made']['wall_time_s'] / 60:.1f} min; seed sd "
          f"{q['seed_sd']:.4f}, paired sd {q['paired_sd']:.4f}, spread {q['true_mean_spread']:.4f}, separation "
          f"{q['separation']:.2f}, halves tau {q['halves_kendall_tau']['tau']:+.2f} "
          f"[{q['halves_kendall_tau']['low']:+.2f}, {q['halves_kendall_tau']['high']:+.2f}], split tau "
          f"{q['split_tau']:+.2f}")
    fit = q.get("width_depth")
    if fit:
        k1 = fit["k1"]
        every = fit["all"]
        print(f"width-depth optimum d_model/L {every['optimum']:.0f} [{every['low']:.0f}, {every['high']:.0f}] over "
              f"{every['shapes']} shapes (trained {every['ratio_range'][0]:.0f}-{every['ratio_range'][1]:.0f})"
              + (f"; K = 1 alone {k1['optimum']:.0f} [{k1['low']:.0f}, {k1['high']:.0f}]" if k1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
