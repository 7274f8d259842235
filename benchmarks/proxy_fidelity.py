"""Figure 12, which proxy and which score can rank shapes: noise, separation and agreement with the reference panel.

    python -m benchmarks.proxy_fidelity                  # about 40 min on 2 cores; writes FIDELITY_FILE
    python -m benchmarks.proxy_fidelity --smoke --out /tmp/fidelity.json
    python -m benchmarks.proxy_fidelity --from-file      # the figures again from the stored runs, no training

Every proxy configuration in ``CONFIGS`` trains the reference panel's 13 shapes
(``benchmarks/reference_panel.py``: the baseline and 12 Prism schedules) on four common seeds
(six for the default), two runs at a time on one core each, and each run is scored several ways (``SCORES``),
all from the same training:

- ``final``: the validation loss of the weight average at the end (today's score);
- ``train_mean`` / ``train_last_half``: the mean training loss over the run, or over its last
  half (the training-speed estimate of Ru et al., "Speedy Performance Estimation for Neural
  Architecture Search", NeurIPS 2021; on common seeds every shape sees the same batches, so batch
  difficulty cancels in the paired difference);
- ``val_auc``: the mean of the validation curve (its area over the run);
- ``extrapolated``: ``L(t) = a + b t^-c`` fitted to the validation curve and read at the
  reference's token count (a learning-curve extrapolation).

For each (configuration, score): the seed sd, the paired sd against the baseline, the spread of
the shapes' true means and the **separation** (spread / paired sd: above about 1.5 one seed ranks
shapes), and **Kendall tau** between the shapes' mean scores and the reference panel's mean
losses, with a 95 % bootstrap interval over seeds (``nas.stats.comparisons.kendall_tau``); and the
CPU seconds a trial of that configuration costs. Configurations keep what defines the space (12
layers, 12 baseline heads: the 129 schedules) and vary what does not: tokens, width (every head
count still divides it), batch with learning rate, context.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.reference_panel import (
    REFERENCE_FILE,
    load_panel,
    losses_by_shape,
    noise,
    panel_shapes,
    split_tau,
    train_runs,
)

FIDELITY_FILE = Path(__file__).parent / "data" / "proxy_fidelity.json"
SCORES = ("final", "train_mean", "train_last_half", "val_auc", "extrapolated")


@dataclass(frozen=True)
class ProxyConfig:
    """A proxy: the ``cpu`` preset's training with ``changes``, at width ``d_model`` (FFN hidden scaled with it;
    None keeps the panel's width)."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()
    d_model: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2, 3)

    def train(self) -> Any:
        from runners.presets import get_preset

        # evaluations every 4k tokens: eight curve points for the curve scores (the preset's 8k gives four)
        return get_preset("cpu").train.with_(eval_every=4_096, threads=1, **dict(self.changes))

    def shapes(self, smoke: bool = False) -> list[Any]:
        from nas.arch import FFNShape

        shapes = panel_shapes(smoke)
        if self.d_model is None or self.d_model == shapes[0].d_model:
            return shapes
        hidden = round(shapes[0].ffn.hidden * self.d_model / shapes[0].d_model)
        return [a.replace(d_model=self.d_model, ffn=FFNShape(1, hidden)) for a in shapes]


CONFIGS = (
    ProxyConfig("cpu (32k tokens, B4 T128, lr 1e-2)", seeds=(0, 1, 2, 3, 4, 5)),  # six: the scores' comparison
    ProxyConfig("2x tokens (64k)", (("tokens", 65_536),), seeds=(0, 1, 2)),
    ProxyConfig("4x tokens (128k)", (("tokens", 131_072), ("lr", 8e-3))),
    ProxyConfig("B8, lr 1.4e-2, 64k tokens", (("tokens", 65_536), ("batch_size", 8), ("lr", 1.4e-2)), seeds=(0, 1, 2)),
    ProxyConfig("T64 B8, 32k tokens", (("seq_len", 64), ("batch_size", 8))),
    ProxyConfig("width 48, 64k tokens", (("tokens", 65_536),), d_model=48),
)


# ----------------------------------------------------------------- scores of one run
def fit_extrapolate(curve: list[list[float]], at_tokens: int) -> float:
    """``a + b t^-c`` least-squares fitted to ``curve`` (tokens, loss), read at ``at_tokens``; the last point when
    the fit fails or has too few points."""
    import numpy as np
    from scipy import optimize

    points = [(t, v) for t, v in curve if v is not None and math.isfinite(v)]
    if len(points) < 4:
        return points[-1][1] if points else math.nan
    t, v = (np.array(x, dtype=float) for x in zip(*points))
    scale = t.max()

    def law(x: Any, a: float, b: float, c: float) -> Any:
        return a + b * (x / scale) ** -c

    try:
        (a, b, c), _ = optimize.curve_fit(law, t, v, p0=(v.min() * 0.9, v.max() - v.min(), 0.5),
                                          bounds=([0, 0, 0.01], [20, 50, 3]), maxfev=5000)
    except (RuntimeError, ValueError):
        return float(v[-1])
    return float(law(at_tokens, a, b, c))


def scores_of(run: dict[str, Any], reference_tokens: int) -> dict[str, float]:
    train = [v for _, v in run["train_curve"] if v is not None]
    evals = [v for _, v in run["eval_curve"] if v is not None]
    half = train[len(train) // 2:]
    return {"final": run["val_loss"], "train_mean": statistics.fmean(train),
            "train_last_half": statistics.fmean(half), "val_auc": statistics.fmean(evals),
            "extrapolated": fit_extrapolate(run["eval_curve"], reference_tokens)}


def pruning_spearman(runs: list[dict[str, Any]]) -> dict[int, float]:
    """``{tokens: Spearman rho}`` between every run's validation loss at an intermediate evaluation and its final
    score, over all the configuration's runs (shapes x seeds): how well a pruner that stops there keeps the runs
    that end best (``nas.study.session.first_pruning_point`` is derived from the default proxy's row)."""
    from scipy import stats

    ok = [r for r in runs if r["status"] == "ok" and r["val_loss"] is not None and math.isfinite(r["val_loss"])]
    points = sorted({int(t) for r in ok for t, _ in r["eval_curve"][:-1]})
    out: dict[int, float] = {}
    for tokens in points:
        pairs = [({int(t): v for t, v in r["eval_curve"]}.get(tokens), r["val_loss"]) for r in ok]
        pairs = [(a, b) for a, b in pairs if a is not None and math.isfinite(a)]
        if len(pairs) >= 3:
            out[tokens] = float(stats.spearmanr(*zip(*pairs)).statistic)
    return out


# ----------------------------------------------------------------- the figure
def evaluate_config(runs: list[dict[str, Any]], panel: dict[str, Any], baseline: str,
                    key_map: dict[str, str]) -> dict[str, Any]:
    """Per score: noise and separation over the config's runs, tau against the panel (shapes mapped to the
    panel's keys by ``key_map``: a width-48 shape stands for its width-96 schedule)."""
    from nas.stats.comparisons import kendall_tau

    reference = losses_by_shape(panel["runs"])
    reference_tokens = int(panel["train"]["tokens"])
    ok = [r for r in runs if r["status"] == "ok" and r["val_loss"] is not None and math.isfinite(r["val_loss"])]
    seconds = statistics.median(r["wall_time_s"] for r in ok) if ok else math.nan
    out: dict[str, Any] = {"cpu_s_per_trial": seconds, "runs": len(runs), "ok": len(ok), "scores": {},
                           "pruning_spearman": pruning_spearman(runs)}
    for score in SCORES:
        table: dict[str, dict[int, float]] = {}
        for r in ok:
            value = scores_of(r, reference_tokens)[score]
            if math.isfinite(value):
                table.setdefault(key_map[r["key"]], {})[int(r["seed"])] = value
        if len(table) < 3 or baseline not in table:
            continue
        figures = noise(table, baseline)
        agreement = kendall_tau({k: list(v.values()) for k, v in table.items()},
                                {k: list(v.values()) for k, v in reference.items()})
        out["scores"][score] = {**figures, "split_tau": split_tau(table), "tau": agreement.tau if agreement else None,
                                "tau_low": agreement.low if agreement else None,
                                "tau_high": agreement.high if agreement else None}
    return out


def figure_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for config in data["configs"]:
        for score, f in config["result"]["scores"].items():
            rows.append({"proxy": config["name"], "score": score, "cpu s/trial": config["result"]["cpu_s_per_trial"],
                         "seed sd": f["seed_sd"], "paired sd": f["paired_sd"], "spread": f["true_mean_spread"],
                         "separation": f["separation"], "self tau": f["split_tau"],
                         "tau vs panel": f["tau"], "tau low": f["tau_low"],
                         "tau high": f["tau_high"]})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| proxy | score | CPU s/trial | seed sd | paired sd | spread | separation | self tau | Kendall tau vs "
             "panel [95 % CI] |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tau = "-" if r["tau vs panel"] is None else \
            f"{r['tau vs panel']:+.2f} [{r['tau low']:+.2f}, {r['tau high']:+.2f}]"
        lines.append(f"| {r['proxy']} | {r['score']} | {r['cpu s/trial']:.1f} | {r['seed sd']:.4f} | "
                     f"{r['paired sd']:.4f} | {r['spread']:.4f} | {r['separation']:.2f} | {r['self tau']:+.2f} | "
                     f"{tau} |")
    return "\n".join(lines)


def pruning_markdown(data: dict[str, Any]) -> str:
    """Per configuration: Spearman rho of the loss at each evaluation against the final score (``pruning_spearman``)."""
    lines = ["| proxy | Spearman rho of the loss at k tokens with the final score |", "|---|---|"]
    for config in data["configs"]:
        points = config["result"].get("pruning_spearman", {})
        cells = ", ".join(f"{int(t) // 1024}k {rho:.2f}" for t, rho in sorted(points.items(), key=lambda x: int(x[0])))
        lines.append(f"| {config['name']} | {cells} |")
    return "\n".join(lines)


def run_configs(configs: tuple[ProxyConfig, ...], smoke: bool, processes: int) -> dict[str, Any]:
    base96 = panel_shapes(smoke)
    out: dict[str, Any] = {"panel": str(REFERENCE_FILE.name), "configs": []}
    for config in configs:
        seeds = config.seeds[:2] if smoke else config.seeds
        shapes = config.shapes(smoke)
        key_map = {a.key(): b.key() for a, b in zip(shapes, base96)}
        train = config.train() if not smoke else config.train().with_(tokens=1_024, batch_size=4, seq_len=32,
                                                                      eval_every=256, eval_tokens=512)
        print(f"== {config.name}: {len(shapes)} shapes x {len(seeds)} seeds", file=sys.stderr, flush=True)
        started = time.perf_counter()
        runs = train_runs(shapes, train, seeds, processes=processes)
        out["configs"].append({"name": config.name, "train": train.to_dict(), "d_model": config.d_model,
                               "key_map": key_map, "seeds": list(seeds),
                               "wall_time_s": time.perf_counter() - started, "runs": runs})
    return out


def with_results(data: dict[str, Any], panel: dict[str, Any]) -> dict[str, Any]:
    for config in data["configs"]:
        config["result"] = evaluate_config(config["runs"], panel, panel["baseline"], config["key_map"])
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy_fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and tokens, two configs: checks the code")
    parser.add_argument("--out", type=Path, default=FIDELITY_FILE, help="the JSON file to write (runs and figures)")
    parser.add_argument("--panel", type=Path, default=REFERENCE_FILE, help="the reference panel to judge against")
    parser.add_argument("--from-file", action="store_true", help="recompute the figures from --out's stored runs")
    parser.add_argument("--only", default="", help="comma-separated config numbers (1-based) to train")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    panel = load_panel(args.panel)
    if args.from_file:
        data = json.loads(args.out.read_text())
    else:
        configs = CONFIGS[:2] if args.smoke else CONFIGS
        if args.only:
            configs = tuple(configs[int(i) - 1] for i in args.only.split(","))
        data = run_configs(configs, args.smoke, max(1, args.processes))
        if args.only and args.out.exists():  # the configurations not re-run keep their stored runs
            stored = json.loads(args.out.read_text())
            fresh = {c["name"] for c in data["configs"]}
            order = [c.name for c in CONFIGS]
            kept = [c for c in stored["configs"] if c["name"] not in fresh]
            data["configs"] = sorted(kept + data["configs"],
                                     key=lambda c: order.index(c["name"]) if c["name"] in order else len(order))
    data = with_results(data, panel)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(markdown(figure_rows(data)))
    print()
    print(pruning_markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
