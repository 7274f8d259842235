"""Figure 12, which proxy and which score can rank shapes: noise, separation and agreement with the reference panel.

    python -m benchmarks.proxy_fidelity                  # about 40 min on 2 cores; writes FIDELITY_FILE
    python -m benchmarks.proxy_fidelity --smoke --out /tmp/fidelity.json
    python -m benchmarks.proxy_fidelity --from-file      # the figures again from the stored runs, no training
    python -m benchmarks.proxy_fidelity --space hourglass  # the width-depth-FFN axis (about 1 h on 2 cores)

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
losses, with a 95 % bootstrap interval over seeds (``nas.stats.comparisons.mean_loss_tau``); and the
CPU seconds a trial of that configuration costs. Configurations keep what defines the space (12
layers, 12 baseline heads: the 129 schedules) and vary what does not: tokens, width (every head
count still divides it), batch with learning rate, context.

``--space hourglass`` judges the proxy on the width-depth-FFN axis against its own panel
(``reference_panel_hourglass.json``: 16 members of the default Hourglass grid and the baseline):
the ``cpu`` proxy on 8 seeds, 2x its tokens on 4 and 4x on 2, so that every configuration costs the
same CPU time a shape. ``budget_rows`` then compares, at equal CPU time, ``k`` seeds of each: Kendall
tau of the shapes' means over ``k`` common seeds against the panel's means (the point: the mean over
every set of ``k`` seeds; the interval: a bootstrap that redraws ``k`` common seeds of the proxy and the
panel's seeds), with the CPU seconds a shape costs. ``cheapest_ranking`` is the cheapest row whose tau
reaches 0.6 with the lower end of its interval above 0: the setup of a CPU search of this axis.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.reference_panel import (
    HOURGLASS_FILE,
    REFERENCE_FILE,
    load_panel,
    losses_by_shape,
    noise,
    panel_shapes,
    provenance,
    split_tau,
    train_runs,
)

FIDELITY_FILE = Path(__file__).parent / "data" / "proxy_fidelity.json"
HOURGLASS_FIDELITY_FILE = Path(__file__).parent / "data" / "proxy_fidelity_hourglass.json"
TAU_TARGET = 0.6  # what a ranking proxy must reach against the panel (its interval's lower end above 0)
SCORES = ("final", "train_mean", "train_last_half", "val_auc", "extrapolated")


@dataclass(frozen=True)
class ProxyConfig:
    """A proxy: the ``cpu`` preset's training with ``changes``, at width ``d_model`` (FFN hidden scaled with it;
    None keeps the panel's width)."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()
    d_model: int | None = None
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    space: str = "prism"

    def train(self) -> Any:
        from runners.presets import get_preset

        # evaluations every 4k tokens: eight curve points for the curve scores (the preset's 8k gives four)
        return get_preset("cpu").train.with_(eval_every=4_096, threads=1, **dict(self.changes))

    def shapes(self, smoke: bool = False) -> list[Any]:
        from nas.arch import FFNShape

        shapes = panel_shapes(smoke, self.space)
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

HOURGLASS_CONFIGS = (  # equal CPU time a shape: 8 x 32k = 4 x 64k = 2 x 128k tokens
    ProxyConfig("cpu (32k tokens, B4 T128, lr 1e-2)", seeds=tuple(range(8)), space="hourglass"),
    ProxyConfig("2x tokens (64k)", (("tokens", 65_536),), seeds=(0, 1, 2, 3), space="hourglass"),
    ProxyConfig("4x tokens (128k, lr 8e-3)", (("tokens", 131_072), ("lr", 8e-3)), seeds=(0, 1), space="hourglass"),
)


def configs_of(space: str) -> tuple[ProxyConfig, ...]:
    return HOURGLASS_CONFIGS if space == "hourglass" else CONFIGS


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
    from nas.stats.comparisons import mean_loss_tau

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
        agreement = mean_loss_tau({k: list(v.values()) for k, v in table.items()},
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


def made() -> dict[str, Any]:
    """Where a configuration's runs came from (``benchmarks.reference_panel.provenance``) and the machine's load when
    they finished (a load above the processes used means the CPU seconds were shared with other work)."""
    return {**provenance(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def run_configs(configs: tuple[ProxyConfig, ...], smoke: bool, processes: int, space: str = "prism",
                on_config: Any = None) -> dict[str, Any]:
    base96 = panel_shapes(smoke, space)
    panel = HOURGLASS_FILE if space == "hourglass" else REFERENCE_FILE
    out: dict[str, Any] = {"panel": str(panel.name), "space": space, "configs": []}
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
                               "key_map": key_map, "seeds": list(seeds), "made": made(),
                               "wall_time_s": time.perf_counter() - started, "runs": runs})
        if on_config is not None:  # a long run keeps every finished configuration
            on_config(out)
    return out


# ----------------------------------------------------------------- equal CPU time: k seeds of each configuration
def tau_at_seeds(table: dict[str, dict[int, float]], reference: dict[str, dict[int, float]], k: int,
                 resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """Kendall tau of the shapes' means over ``k`` common proxy seeds against the panel's means (module docstring):
    the mean over every set of ``k`` seeds (at most 70 sets), and a bootstrap interval redrawing ``k`` common seeds
    of the proxy (with replacement) and the panel's seeds."""
    import itertools
    import random

    from benchmarks.reference_panel import _tau

    keys = sorted(set(table) & set(reference))
    seeds = sorted(set.intersection(*(set(table[key]) for key in keys)))
    panel_seeds = sorted(set.intersection(*(set(reference[key]) for key in keys)))
    panel_means = [statistics.fmean(reference[key][s] for s in panel_seeds) for key in keys]
    subsets = list(itertools.islice(itertools.combinations(seeds, k), 70))
    point = statistics.fmean(_tau([statistics.fmean(table[key][s] for s in subset) for key in keys], panel_means)
                             for subset in subsets)
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        chosen, panel_chosen = rng.choices(seeds, k=k), rng.choices(panel_seeds, k=len(panel_seeds))
        draws.append(_tau([statistics.fmean(table[key][s] for s in chosen) for key in keys],
                          [statistics.fmean(reference[key][s] for s in panel_chosen) for key in keys]))
    draws.sort()
    return {"tau": point, "low": draws[int(0.025 * resamples)], "high": draws[int(0.975 * resamples) - 1],
            "subsets": len(subsets)}


def budget_rows(data: dict[str, Any], panel: dict[str, Any], score: str = "final") -> list[dict[str, Any]]:
    """One row per (configuration, k seeds): tau against the panel with its interval, and its cost a shape in
    proxy trials (``k`` x tokens / the ``cpu`` preset's tokens: every configuration trains the same shapes at the
    same batch and context, so CPU time goes with tokens) beside the measured CPU seconds (which other work on the
    machine inflates); rows and the cheapest choice go by proxy trials."""
    from runners.presets import get_preset

    unit = get_preset("cpu").train.tokens
    reference = losses_by_shape(panel["runs"])
    rows = []
    for config in data["configs"]:
        table: dict[str, dict[int, float]] = {}
        for r in config["runs"]:
            if r["status"] == "ok" and r["val_loss"] is not None and math.isfinite(r["val_loss"]):
                value = scores_of(r, int(panel["train"]["tokens"]))[score]
                table.setdefault(config["key_map"][r["key"]], {})[int(r["seed"])] = value
        per_trial = config["result"]["cpu_s_per_trial"]
        k = 1
        while k <= len(config["seeds"]):
            tau = tau_at_seeds(table, reference, k)
            rows.append({"proxy": config["name"], "seeds": k, "proxy_trials": k * config["train"]["tokens"] / unit,
                         "cpu_s_per_shape": k * per_trial, **tau})
            k *= 2
    return sorted(rows, key=lambda r: (r["proxy_trials"], -r["tau"]))


def cheapest_ranking(rows: list[dict[str, Any]], target: float = TAU_TARGET) -> dict[str, Any] | None:
    """The cheapest row whose tau reaches ``target`` with the lower end of its interval above 0."""
    return next((r for r in rows if r["tau"] >= target and r["low"] > 0), None)


def budget_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| proxy | seeds a shape | cost a shape (proxy trials) | CPU s a shape | Kendall tau vs panel [95 %] |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['proxy']} | {r['seeds']} | {r['proxy_trials']:g} | {r['cpu_s_per_shape']:.0f} | "
                     f"{r['tau']:+.2f} "
                     f"[{r['low']:+.2f}, {r['high']:+.2f}] |")
    return "\n".join(lines)


def with_results(data: dict[str, Any], panel: dict[str, Any]) -> dict[str, Any]:
    for config in data["configs"]:
        config["result"] = evaluate_config(config["runs"], panel, panel["baseline"], config["key_map"])
    return data


def run(cfg: Any) -> Any:
    """Figure 12 in the harness (``nas bench --only proxy_fidelity``, long: real training): every Prism configuration
    against the stored reference panel; ``--smoke`` trains two configurations of tiny shapes against a smoke panel
    made on the spot (checks the code, measures nothing). ``python -m benchmarks.proxy_fidelity`` also writes the
    data file and runs the Hourglass axis."""
    import tempfile

    from benchmarks.harness import Figure
    from benchmarks.reference_panel import build_panel

    started = time.perf_counter()
    processes = max(1, min(2, cfg.threads or 2))
    if cfg.smoke:
        with tempfile.TemporaryDirectory() as folder:
            panel = build_panel(smoke=True, processes=1, out=Path(folder) / "panel.json")
        data = with_results(run_configs(CONFIGS[:1], True, 1), panel)
    else:
        panel = load_panel(REFERENCE_FILE)
        data = with_results(run_configs(CONFIGS, False, processes), panel)
    rows = figure_rows(data)
    best = max(rows, key=lambda r: r["separation"]) if rows else None
    return Figure(
        number=12, name="proxy_fidelity", title="Which proxy and which score rank Prism schedules: separation and "
        "Kendall tau against the reference panel", target="report (separation >= 1.5 and tau >= 0.6 would rank)",
        method="every configuration of CONFIGS trains the reference panel's 13 shapes on common seeds, two runs at a "
               "time on one core each; five scores from the same runs (module docstring)",
        columns=list(rows[0]) if rows else [], rows=rows, passed=None,
        summary=(f"best separation {best['separation']:.2f} ({best['proxy']}, {best['score']})" if best else "no rows"),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy_fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=("prism", "hourglass"), default="prism", help="the axis and its panel")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and tokens, two configs: checks the code")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file to write (runs and figures; default "
                        "the space's file in benchmarks/data)")
    parser.add_argument("--panel", type=Path, default=None, help="the reference panel to judge against (default the "
                        "space's)")
    parser.add_argument("--from-file", action="store_true", help="recompute the figures from --out's stored runs")
    parser.add_argument("--only", default="", help="comma-separated config numbers (1-based) to train")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    hourglass = args.space == "hourglass"
    out = args.out or (HOURGLASS_FIDELITY_FILE if hourglass else FIDELITY_FILE)
    panel = load_panel(args.panel or (HOURGLASS_FILE if hourglass else REFERENCE_FILE))
    all_configs = configs_of(args.space)
    if args.from_file:
        data = json.loads(out.read_text())
    else:
        configs = all_configs[:2] if args.smoke else all_configs
        if args.only:
            configs = tuple(configs[int(i) - 1] for i in args.only.split(","))
        stored = json.loads(out.read_text()) if (args.only or hourglass) and out.exists() else None

        def merged(fresh: dict[str, Any]) -> dict[str, Any]:
            """The fresh configurations, and the stored ones not re-run (in ``all_configs``'s order)."""
            if stored is None:
                return fresh
            names = {c["name"] for c in fresh["configs"]}
            order = [c.name for c in all_configs]
            kept = [c for c in stored["configs"] if c["name"] not in names]
            return {**fresh, "configs": sorted(kept + fresh["configs"], key=lambda c: order.index(c["name"])
                                               if c["name"] in order else len(order))}

        if hourglass and stored is not None and not args.only:  # resume: configurations already stored are kept
            done = {c["name"] for c in stored["configs"]}
            configs = tuple(c for c in configs if c.name not in done)

        def save(partial: dict[str, Any]) -> None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(merged(partial), indent=1) + "\n")

        data = merged(run_configs(configs, args.smoke, max(1, args.processes), args.space, on_config=save))
    data = with_results(data, panel)
    if hourglass:
        data["budget_rows"] = budget_rows(data, panel)
        data["cheapest_ranking"] = cheapest_ranking(data["budget_rows"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(markdown(figure_rows(data)))
    print()
    print(pruning_markdown(data))
    if hourglass:
        print()
        print(budget_markdown(data["budget_rows"]))
        print(f"cheapest configuration that ranks (tau >= {TAU_TARGET}, interval above 0): "
              f"{data['cheapest_ranking']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
