"""The leaderboard: one row per shape, ranked by its seed-adjusted loss, with its mean over seeds and a 95% CI.

``adjusted_loss`` (``nas.study.records.seed_adjusted_means``) is the shape's loss put on the
baseline's seeds: shapes trained on seed 0 only and shapes raced over nine seeds rank on one scale.
``ci95 = t_{0.975, n-1} * s / sqrt(n)`` (Student's t quantile from ``scipy.stats``, sample
standard deviation ``s`` over the shape's seed replicates; none for a single seed).
``gain_pct = 100 (L_base - L_adj) / L_base``: positive when the shape beats the baseline's mean loss.
Shapes and their means come from ``nas.study.records.scores_by_shape``, the one place a shape's
mean over seeds is computed.
"""

from __future__ import annotations

import math
from statistics import fmean, stdev

import optuna
import pandas as pd
from optuna.trial import FrozenTrial
from scipy import stats

from nas.arch import format_plateaus
from nas.study.records import scores_by_shape, seed_adjusted_means


def ci95(values: list[float] | tuple[float, ...]) -> float | None:
    """Half-width of the 95% Student-t interval of the mean of ``values``; None for fewer than two."""
    n = len(values)
    if n < 2:
        return None
    return float(stats.t.ppf(0.975, n - 1)) * stdev(values) / math.sqrt(n)


def leaderboard(study: optuna.Study, top: int | None = None) -> pd.DataFrame:
    """Shapes ranked by seed-adjusted loss; the baseline row is always included (``is_baseline``).

    Each row carries the shape itself as ``arch`` (an ``ArchConfig`` dict), so that a row of
    ``nas best --format json`` is a valid ``nas train --config``.
    """
    return leaderboard_of(study.get_trials(deepcopy=False), study.user_attrs.get("nas:baseline_key"), top)


def leaderboard_of(trials: list[FrozenTrial], baseline_key: str | None, top: int | None = None) -> pd.DataFrame:
    """``leaderboard`` of a list of trials (numbered 0, 1, ... as a study numbers them)."""
    scores = scores_by_shape(trials)
    if not scores:
        return pd.DataFrame()
    base = scores.get(baseline_key)
    adjusted = seed_adjusted_means(scores, baseline_key)
    rows = []
    for key, shape in scores.items():
        attrs = [trials[n].user_attrs for n in shape.trials]
        first = attrs[0]
        mean, adj = shape.mean, adjusted[key]
        speeds = [a["tokens_per_s"] for a in attrs if a.get("tokens_per_s") is not None]
        rows.append({
            "heads": format_plateaus(first["heads"]), "k": first.get("k"), "d_h": first.get("d_h"),
            "d_model": first.get("d_model"), "layers": first.get("layers"), "seeds": shape.n,
            "adjusted_loss": adj, "mean_loss": mean, "ci95": ci95(shape.losses),
            "gain_pct": 100 * (base.mean - adj) / base.mean if base else None,
            "params": first.get("params"), "tokens_per_s": fmean(speeds) if speeds else None,
            "trials": ",".join(map(str, shape.trials)), "is_baseline": key == baseline_key, "key": key,
            "arch": first.get("arch"),
        })
    board = pd.DataFrame(rows).sort_values(["adjusted_loss", "mean_loss"], kind="stable").reset_index(drop=True)
    board.insert(0, "rank", range(1, len(board) + 1))
    if top is not None:
        board = board[(board.index < top) | board["is_baseline"]]
    return board
