"""How often the ``cpu-hourglass`` proxy diverges on the deep ``K > 1`` shapes of its Hourglass grid, and what a retry
at half the learning rate gives them.

    python -m benchmarks.divergence                   # about an hour of one core; writes DIVERGENCE_FILE
    python -m benchmarks.divergence --smoke --out /tmp/divergence.json   # seconds: the tiny preset, checks the code
    python -m benchmarks.divergence --summary         # the figures again from the stored runs, no training

A search of the Hourglass axis at ``cpu-hourglass`` (lr 8e-3, 128k tokens) recorded 2 of 100 trained shapes as
diverged (depth 6 at ``K = 6``, depth 18 at ``K = 2``): a failure, which the board leaves out, so a proxy that
diverges on some shapes biases the search against them. This measures the rate where it was seen:

- **shapes**: one member of each (K, L) cell of the ``cpu`` preset's default Hourglass grid with ``K`` in 2, 4, 6, 8
  and ``L`` in 6, 9, 12, 18, 24 (the cell's middle member by its ``d_h / d_model`` grid ratio): 20 shapes;
- **seeds** 0, 1, 2 each, trained as a search trains them (``runners.proxy.run``, one thread, one run at a time);
- **the cells seen to diverge**: every member of the (K, L) cells of the two shapes the recorded search saw diverge
  (``K = 6`` at depth 6, ``K = 2`` at depth 18; their ``d_h / d_model`` was not recorded), seeds 0 and 1;
- **retry**: every run that diverged, trained again on its seed at half the rate (4e-3), to see whether it then
  trains and where its loss lands beside the shape's runs that did not diverge.

The file holds every run (status, the step and loss it diverged at, final loss, time), the machine (CPU model,
cores, its measured fp32 matmul peak) and the commit; runs are written as they finish and the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.reference_panel import _write_json, current_commit, shape_record, train_runs

DIVERGENCE_FILE = Path(__file__).parent / "data" / "divergence_hourglass.json"
DEPTHS = (6, 9, 12, 18, 24)
KS = (2, 4, 6, 8)
SEEDS = (0, 1, 2)
SEEN_CELLS = ((6, 6), (2, 18))  # (K, L) of the two shapes the recorded search saw diverge
SEEN_SEEDS = (0, 1)
RETRY_FACTOR = 0.5


def grid_cells(smoke: bool = False) -> dict[tuple[int, int], list[Any]]:
    """The deep ``K > 1`` members of the grid by (K, L) cell, each cell's members by their ``d_h / d_model``."""
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space

    preset = get_preset("tiny" if smoke else "cpu")
    space = build_space(SpaceOptions(space="hourglass"), defaults=preset.baseline)
    cells: dict[tuple[int, int], list[Any]] = {}
    for arch in space:
        if arch.ffn.k > 1 and arch.n_layers >= (2 if smoke else min(DEPTHS)):
            cells.setdefault((arch.ffn.k, arch.n_layers), []).append(arch)
    return {cell: sorted(members, key=lambda a: a.ffn.hidden / a.d_model) for cell, members in cells.items()}


def deep_shapes(smoke: bool = False) -> list[Any]:
    """The sample: one member per (K, L) cell of the grid (module docstring), deepest last."""
    cells = grid_cells(smoke)
    wanted = [(k, depth) for k in KS for depth in DEPTHS] if not smoke else sorted(cells)[:2]
    chosen = [cells[cell][len(cells[cell]) // 2] for cell in wanted if cells.get(cell)]
    return sorted(chosen, key=lambda a: (a.n_layers, a.ffn.k))


def seen_cell_shapes(smoke: bool = False) -> list[Any]:
    """Every member of the cells where the recorded search saw a shape diverge (``SEEN_CELLS``)."""
    cells = grid_cells(smoke)
    wanted = SEEN_CELLS if not smoke else sorted(cells)[:1]
    return [arch for cell in wanted for arch in cells.get(cell, [])]


def proxy_train(smoke: bool = False) -> Any:
    from runners.presets import get_preset

    if smoke:  # a rate that makes the tiny runs diverge, so that the retries run too
        return get_preset("tiny").train.with_(threads=1, lr=0.3)
    return get_preset("cpu-hourglass").train.with_(threads=1)


def diverged_at(run: dict[str, Any]) -> int | None:
    """The tokens a diverged run had trained when it stopped, read from its stored curve (its last training point)."""
    if run["status"] != "diverged" or not run["train_curve"]:
        return None
    return int(run["train_curve"][-1][0])


def machine() -> dict[str, Any]:
    """What the machine is and measured: CPU model, cores, fp32 matmul peak (one thread, as the runs train)."""
    import torch

    from benchmarks.harness import cpu_model
    from runners.peak import measure_matmul_peak

    torch.set_num_threads(1)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": 1, "torch": torch.__version__,
            "fp32_matmul_peak_gflops": round(measure_matmul_peak(torch.device("cpu")) / 1e9, 1)}


def _rate(runs: list[dict[str, Any]]) -> str:
    return f"{sum(r['status'] == 'diverged' for r in runs)}/{len(runs)}"


def stage_summary(runs: list[dict[str, Any]], shapes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One stage's counts of diverged runs: overall, shapes with a diverged seed, by K, by depth, by the shape."""
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_shape.setdefault(run["key"], []).append(run)
    return {
        "runs_diverged": _rate(runs),
        "shapes_with_a_diverged_seed": f"{sum(any(r['status'] == 'diverged' for r in v) for v in by_shape.values())}"
                                       f"/{len(by_shape)}",
        "by_k": {str(k): _rate([r for r in runs if shapes[r["key"]]["k"] == k])
                 for k in sorted({shapes[r["key"]]["k"] for r in runs})},
        "by_depth": {str(d): _rate([r for r in runs if shapes[r["key"]]["n_layers"] == d])
                     for d in sorted({shapes[r["key"]]["n_layers"] for r in runs})},
        "diverged": [{"label": r["label"], "seed": r["seed"], "d_h_over_d_model": round(
            shapes[r["key"]]["d_h"] / shapes[r["key"]]["d_model"], 3), "at_tokens": diverged_at(r)}
            for r in runs if r["status"] == "diverged"],
    }


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Each stage's counts (the sample of every deep cell; every member of the cells seen to diverge), all runs
    together, and each retry beside the same shape's runs that did not diverge."""
    shapes = {s["key"]: s for s in data["shapes"]}
    first = [r for r in data["runs"] if not r.get("retry")]
    stages = {"sample": (set(data["sample"]), set(data["seeds"])),
              "seen_cells": (set(data.get("seen_cells", [])), set(data.get("seen_seeds", [])))}
    out: dict[str, Any] = {name: stage_summary([r for r in first if r["key"] in keys and r["seed"] in seeds], shapes)
                           for name, (keys, seeds) in stages.items() if keys}
    out["all_runs_diverged"] = _rate(first)
    out["tokens"] = data["train"]["tokens"]
    out["retries"] = []
    for retry in (r for r in data["runs"] if r.get("retry")):
        same = [r["val_loss"] for r in first if r["key"] == retry["key"] and r["status"] == "ok"]
        out["retries"].append({"label": retry["label"], "seed": retry["seed"], "status": retry["status"],
                               "val_loss": retry["val_loss"],
                               "shape_ok_seeds_mean": statistics.fmean(same) if same else None,
                               "shape_ok_seeds": len(same)})
    ok = [r["val_loss"] for r in first if r["status"] == "ok"]
    out["ok_loss_range"] = [min(ok), max(ok)] if ok else None
    return out


def build(smoke: bool, out: Path) -> dict[str, Any]:
    """Train (or finish) both stages' runs and the retries, writing ``out`` after every run."""
    train = proxy_train(smoke)
    sample, seen = deep_shapes(smoke), seen_cell_shapes(smoke)
    seeds = SEEDS[:2] if smoke else SEEDS
    shapes = list({a.key(): a for a in (*sample, *seen)}.values())
    data: dict[str, Any] = {
        "what": "cpu-hourglass proxy runs of deep K > 1 members of the cpu preset's Hourglass grid: how often they "
                "diverge (a sample of every deep cell, and every member of the two cells the recorded search saw "
                "diverge), and a retry of each diverged run at half the learning rate",
        "command": "python -m benchmarks.divergence" + (" --smoke" if smoke else ""), "complete": False,
        "commit": current_commit(), "machine": machine(), "train": train.to_dict(),
        "retry_lr": train.lr * RETRY_FACTOR, "shapes": [shape_record(a) for a in shapes],
        "sample": [a.key() for a in sample], "seeds": list(seeds),
        "seen_cells": [a.key() for a in seen], "seen_seeds": list(SEEN_SEEDS), "runs": [], "wall_time_s": 0.0,
    }
    stored = json.loads(out.read_text()) if out.exists() else None
    if stored and stored.get("train") == data["train"]:  # the same proxy: its runs are kept, whatever stage made them
        data["runs"], data["wall_time_s"] = stored["runs"], stored.get("wall_time_s", 0.0)
        data["machine"], data["commit"] = stored.get("machine", data["machine"]), stored.get("commit", data["commit"])
        print(f"resuming {out}: {len(data['runs'])} runs kept", file=sys.stderr, flush=True)
    before, started = data["wall_time_s"], time.perf_counter()

    def write(runs: list[dict[str, Any]], retry: bool = False) -> None:
        kept = [r for r in data["runs"] if bool(r.get("retry")) != retry]
        data["runs"] = kept + [{**r, "retry": retry} for r in runs]
        data["wall_time_s"] = before + time.perf_counter() - started
        _write_json(out, data)

    first = [r for r in data["runs"] if not r.get("retry")]
    for stage_shapes, stage_seeds in ((sample, seeds), (seen, SEEN_SEEDS[:1] if smoke else SEEN_SEEDS)):
        first = train_runs(stage_shapes, train, stage_seeds, processes=1, done=first, on_run=write)
        write(first)
    by_key = {a.key(): a for a in shapes}
    retried = [r for r in data["runs"] if r.get("retry")]
    slower = train.with_(lr=train.lr * RETRY_FACTOR)
    for run in (r for r in first if r["status"] == "diverged"):
        retried = train_runs([by_key[run["key"]]], slower, (run["seed"],), processes=1, done=retried,
                             on_run=lambda runs: write(runs, retry=True))
    data["complete"] = True
    data["summary"] = summary(data)
    _write_json(out, data)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.divergence", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny preset's grid, two shapes: checks the code")
    parser.add_argument("--out", type=Path, default=DIVERGENCE_FILE, help="the JSON file to write")
    parser.add_argument("--summary", action="store_true", help="train nothing: the figures of --out's stored runs")
    args = parser.parse_args(argv)
    if args.summary:
        data = json.loads(args.out.read_text())
        data["summary"] = summary(data)
    else:
        data = build(args.smoke, args.out)
    print(json.dumps({"machine": data["machine"], **data["summary"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
