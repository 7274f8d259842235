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
RETRY_FACTOR = 0.5


def deep_shapes(smoke: bool = False) -> list[Any]:
    """One member per (K, L) cell of the grid (module docstring), deepest last."""
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space

    preset = get_preset("tiny" if smoke else "cpu")
    space = build_space(SpaceOptions(space="hourglass"), defaults=preset.baseline)
    cells: dict[tuple[int, int], list[Any]] = {}
    for arch in space:
        if arch.ffn.k > 1 and arch.n_layers >= (2 if smoke else min(DEPTHS)):
            cells.setdefault((arch.ffn.k, arch.n_layers), []).append(arch)
    wanted = [(k, depth) for k in KS for depth in DEPTHS] if not smoke else sorted(cells)[:2]
    chosen = []
    for cell in wanted:
        members = sorted(cells.get(cell, []), key=lambda a: a.ffn.hidden / a.d_model)
        if members:
            chosen.append(members[len(members) // 2])
    return sorted(chosen, key=lambda a: (a.n_layers, a.ffn.k))


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


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """Counts of diverged runs (overall, by K, by depth), shapes with any diverged seed, and the retries."""
    first = [r for r in data["runs"] if not r.get("retry")]
    retries = [r for r in data["runs"] if r.get("retry")]
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for run in first:
        by_shape.setdefault(run["key"], []).append(run)

    def rate(runs: list[dict[str, Any]]) -> str:
        return f"{sum(r['status'] == 'diverged' for r in runs)}/{len(runs)}"

    shapes = {s["key"]: s for s in data["shapes"]}
    out: dict[str, Any] = {
        "runs_diverged": rate(first),
        "shapes_with_a_diverged_seed": f"{sum(any(r['status'] == 'diverged' for r in v) for v in by_shape.values())}"
                                       f"/{len(by_shape)}",
        "by_k": {str(k): rate([r for r in first if shapes[r["key"]]["k"] == k]) for k in sorted(
            {s["k"] for s in data["shapes"]})},
        "by_depth": {str(d): rate([r for r in first if shapes[r["key"]]["n_layers"] == d]) for d in sorted(
            {s["n_layers"] for s in data["shapes"]})},
        "diverged_at_tokens": sorted(t for r in first if (t := diverged_at(r)) is not None),
        "tokens": data["train"]["tokens"],
        "retries": [],
    }
    for retry in retries:
        same = [r["val_loss"] for r in by_shape.get(retry["key"], []) if r["status"] == "ok"]
        out["retries"].append({"label": retry["label"], "seed": retry["seed"], "status": retry["status"],
                               "val_loss": retry["val_loss"],
                               "shape_ok_seeds_mean": statistics.fmean(same) if same else None,
                               "shape_ok_seeds": len(same)})
    ok = [r["val_loss"] for r in first if r["status"] == "ok"]
    out["ok_loss_range"] = [min(ok), max(ok)] if ok else None
    return out


def build(smoke: bool, out: Path) -> dict[str, Any]:
    """Train (or finish) the runs and the retries, writing ``out`` after every run."""
    shapes, train = deep_shapes(smoke), proxy_train(smoke)
    seeds = SEEDS[:2] if smoke else SEEDS
    data: dict[str, Any] = {
        "what": "cpu-hourglass proxy runs of deep K > 1 members of the cpu preset's Hourglass grid: how often they "
                "diverge, and a retry of each diverged run at half the learning rate",
        "command": "python -m benchmarks.divergence" + (" --smoke" if smoke else ""), "complete": False,
        "commit": current_commit(), "machine": machine(), "train": train.to_dict(),
        "retry_lr": train.lr * RETRY_FACTOR, "shapes": [shape_record(a) for a in shapes], "seeds": list(seeds),
        "runs": [], "wall_time_s": 0.0,
    }
    stored = json.loads(out.read_text()) if out.exists() else None
    if stored and stored.get("train") == data["train"] and stored.get("shapes") == data["shapes"]:
        data["runs"], data["wall_time_s"] = stored["runs"], stored.get("wall_time_s", 0.0)
        print(f"resuming {out}: {len(data['runs'])} runs kept", file=sys.stderr, flush=True)
    before, started = data["wall_time_s"], time.perf_counter()

    def write(runs: list[dict[str, Any]], retry: bool = False) -> None:
        kept = [r for r in data["runs"] if bool(r.get("retry")) != retry]
        data["runs"] = kept + [{**r, "retry": retry} for r in runs]
        data["wall_time_s"] = before + time.perf_counter() - started
        _write_json(out, data)

    first = train_runs(shapes, train, seeds, processes=1,
                       done=[r for r in data["runs"] if not r.get("retry")], on_run=write)
    write(first)
    failed = [(r["key"], r["seed"]) for r in first if r["status"] == "diverged"]
    by_key = {a.key(): a for a in shapes}
    retried = [r for r in data["runs"] if r.get("retry")]
    slower = train.with_(lr=train.lr * RETRY_FACTOR)
    for key, seed in failed:
        retried = train_runs([by_key[key]], slower, (seed,), processes=1, done=retried,
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
