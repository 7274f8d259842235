"""Figure 11, what the proxy can resolve: seed noise, paired noise, pruning, and quieter proxies (real training).

    nas bench --only proxy_noise          # about 30 min on 2 cores; --smoke for a few tiny runs

On the default ``cpu`` proxy (``runners.proxy.run``, builtin data):

- **(a, b) noise**: six schedules x eight seeds. (a) the seed sd of one shape's score (pooled
  within-shape sd); (b) the sd of the paired difference between two shapes on common seeds
  (against the baseline, pooled); and the spread of the shapes' true means,
  ``sqrt(var(shape means) - b^2 / (2 n_seeds))``, whose ratio to (b) says how well the proxy
  separates shapes (the shared seed effect cancels in both);
- **(c) pruning**: all 129 schedules trained to the end on seed 0 with their intermediate
  evaluations; the Spearman correlation between the loss at each pruning point and the final
  loss, and how many of the final top 10 the median pruner (Optuna's rule: stop when the value
  is worse than the median of completed trials at that step, after 5 of them) would have stopped
  in the walk's order;
- **quieter proxies** at equal CPU time per trial: the current proxy, an average of the weights
  (EMA) as the scored model, the mean of the last three full evaluations as the score, and a
  batch of 16 with a scaled learning rate and the tokens of the same time; each with the six
  schedules x four seeds, their separation ratio compared.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from benchmarks.harness import BenchConfig, Figure

SCHEDULES = ((12,) * 12, (3, 3, 6, 6) + (12,) * 8, (1, 1, 2, 2, 4, 4) + (12,) * 6, (6,) * 4 + (12,) * 8,
             (2, 2) + (12,) * 10, (4, 4, 4, 8, 8, 8) + (12,) * 6)
NOISE_SEEDS = 8
VARIANT_SEEDS = 4


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy import stats

    return float(stats.spearmanr(a, b).statistic)


def noise_figures(losses: dict[tuple[int, ...], list[float]]) -> dict[str, float]:
    """Seed sd, paired sd (against the first schedule), true-mean spread and their ratio."""
    shapes = list(losses)
    within = [statistics.variance(v) for v in losses.values() if len(v) >= 2]
    seed_sd = math.sqrt(statistics.fmean(within))
    base = losses[shapes[0]]
    diffs = [[b - x for b, x in zip(base, losses[s])] for s in shapes[1:]]
    paired_sd = math.sqrt(statistics.fmean(statistics.variance(d) for d in diffs))
    n = min(len(v) for v in losses.values())
    means = [statistics.fmean(v) for v in losses.values()]
    spread = math.sqrt(max(0.0, statistics.variance(means) - paired_sd**2 / (2 * n)))
    return {"seed sd": seed_sd, "paired sd": paired_sd, "true-mean spread": spread,
            "separation (spread / paired sd)": spread / paired_sd if paired_sd else math.inf}


def median_pruned(curves: list[dict[int, float]], final_step: int, startup: int = 5) -> list[bool]:
    """Which members (in walk order) Optuna's median pruner stops, given each one's intermediate values."""
    completed: list[dict[int, float]] = []
    out = []
    for curve in curves:
        pruned = False
        for step in sorted(curve):
            if step >= final_step:
                break
            seen = [c[step] for c in completed if step in c]
            if len(seen) >= startup and curve[step] > statistics.median(seen):
                pruned = True
                break
        out.append(pruned)
        if not pruned:
            completed.append(curve)
    return out


def run(cfg: BenchConfig) -> Figure:
    from nas.data import load_data
    from runners.presets import get_preset
    from runners.proxy import run as train
    from search_spaces.factory import SpaceOptions, build_space

    started = time.perf_counter()
    preset = get_preset("tiny" if cfg.smoke else "cpu")
    if cfg.smoke:  # a few quick runs: checks the code, measures nothing
        preset = type(preset)(preset.name, preset.description, preset.baseline, preset.train.with_(tokens=512))
    data = load_data("builtin", cache_dir=cfg.cache_dir)
    base = preset.baseline
    schedules = [s for s in SCHEDULES if len(s) == base.n_layers] or [base.heads, (2, 2, 4, 4), (1, 1, 4, 4)]
    if cfg.smoke:
        schedules = schedules[:3]
    seeds = 2 if cfg.smoke else NOISE_SEEDS

    def scores(train_cfg, n_seeds: int) -> dict[tuple[int, ...], list[float]]:
        return {s: [train(base.replace(heads=list(s)), train_cfg.with_(seed=seed), data).val_loss
                    for seed in range(n_seeds)] for s in schedules}

    rows: list[dict[str, Any]] = []
    noise = noise_figures(scores(preset.train, seeds))
    rows.append({"part": "(a, b) noise, current proxy", **{k: round(v, 4) for k, v in noise.items()},
                 "runs": len(schedules) * seeds})
    # (c) every member to the end on seed 0, with its pruning-point evaluations
    space = build_space(SpaceOptions(space="prism"), defaults=base)
    members = list(space)[: 4 if cfg.smoke else None]
    curves, finals = [], []
    for arch in members:
        result = train(arch, preset.train, data)
        curves.append({int(t): v for t, v in result.eval_curve})
        finals.append(result.val_loss)
    final_step = preset.train.steps * preset.train.tokens_per_step
    points = sorted({t for c in curves for t in c if t < final_step})
    correlations = {t: _spearman([c[t] for c in curves], finals) for t in points}
    pruned = median_pruned(curves, final_step)
    top10 = sorted(range(len(finals)), key=finals.__getitem__)[:10]
    rows.append({"part": "(c) pruning", "members": len(members),
                 **{f"spearman at {t} tokens": round(r, 3) for t, r in correlations.items()},
                 "median pruner stops (of all)": sum(pruned), "of the final top 10": sum(pruned[i] for i in top10)})
    # quieter proxies at equal CPU time per trial
    speeds = {}
    for batch in (preset.train.batch_size, 16):
        probe = train(base, preset.train.with_(batch_size=batch, tokens=batch * preset.train.seq_len * 8), data)
        speeds[batch] = probe.tokens_per_s
    big = preset.train.batch_size * 4
    step_16 = 16 * preset.train.seq_len
    tokens_16 = int(preset.train.tokens * speeds[16] / speeds[preset.train.batch_size]) // step_16 * step_16
    variants = {
        "current": preset.train,
        "EMA of weights (0.9)": preset.train.with_(ema_decay=0.9),
        "mean of last 3 evaluations": preset.train.with_(score_evals=3),
        f"batch {big}, lr x2, equal time": preset.train.with_(batch_size=big, lr=2 * preset.train.lr,
                                                           tokens=max(tokens_16, big * preset.train.seq_len)),
    }
    for name, variant in variants.items():
        figures = noise_figures(scores(variant, 2 if cfg.smoke else VARIANT_SEEDS))
        rows.append({"part": f"variant: {name}", **{k: round(v, 4) for k, v in figures.items()},
                     "tokens": variant.tokens, "runs": len(schedules) * (2 if cfg.smoke else VARIANT_SEEDS)})
    columns = sorted({k for r in rows for k in r}, key=lambda k: (k != "part", k))
    return Figure(number=11, name="proxy_noise", title="What the proxy can resolve: noise, pruning, quieter proxies",
                  target="report (the default cpu preset is chosen by the separation ratio)",
                  method=__doc__.split("\n\n", 2)[2].strip().replace("\n", " "), columns=columns, rows=rows,
                  passed=None, summary=(f"seed sd {noise['seed sd']:.3f}, paired sd {noise['paired sd']:.3f}, "
                                        f"separation {noise['separation (spread / paired sd)']:.2f}; median pruner "
                                        f"stops {sum(pruned[i] for i in top10)} of the final top 10"),
                  seconds=time.perf_counter() - started, smoke=cfg.smoke)
