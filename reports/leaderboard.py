"""The leaderboard: one row per shape, ranked by its shrunk paired gain, with its mean over seeds and a 95% CI.

``ranked_loss`` (``nas.stats.shrinkage``) is the baseline's mean loss plus the empirical-Bayes posterior
mean of the shape's paired difference from it: a one-seed shape is shown at the gain it can be
expected to keep (``expected_gain_pct`` with its 95 % posterior interval, ``shrink`` the weight its own
seeds get), so one lucky seed does not top the board. ``adjusted_loss``
(``nas.study.records.seed_adjusted_means``) is the unshrunk loss put on the baseline's seeds.
``ci95 = t_{0.975, n-1} * s / sqrt(n)`` (Student's t quantile, ``scipy.special.stdtrit``, sample
standard deviation ``s`` over the shape's seed replicates; none for a single seed).
``gain_pct = 100 (L_base - L_adj) / L_base``: positive when the shape beats the baseline's mean loss.
Shapes and their means come from ``nas.study.records.scores_by_shape``, the one place a shape's
mean over seeds is computed.
"""

from __future__ import annotations

import math
from statistics import fmean, median, stdev
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial
from scipy.special import stdtrit

from nas.arch import format_plateaus
from nas.stats.board import Ranking, rank_shapes
from nas.stats.scores import ShapeScores, mean_by_seed, seed_adjusted_means
from nas.stats.shrinkage import Fit
from nas.study.records import scores_by_shape


def ci95(values: list[float] | tuple[float, ...]) -> float | None:
    """Half-width of the 95% Student-t interval of the mean of ``values``; None for fewer than two."""
    n = len(values)
    if n < 2:
        return None
    return float(stdtrit(n - 1, 0.975)) * stdev(values) / math.sqrt(n)


def leaderboard(study: optuna.Study, top: int | None = None) -> pd.DataFrame:
    """Shapes ranked by ``nas.stats.board.ranking``; the baseline row is always included (``is_baseline``).

    Each row carries the shape itself as ``arch`` (an ``ArchConfig`` dict), so that a row of
    ``nas best --format json`` is a valid ``nas train --config``.
    """
    return leaderboard_of(study.get_trials(deepcopy=False), study.user_attrs.get("nas:baseline_key"), top)


def leaderboard_of(trials: list[FrozenTrial], baseline_key: str | None, top: int | None = None,
                   model: Fit | None = None, ranking: Ranking | None = None,
                   scores: dict[str, ShapeScores] | None = None) -> pd.DataFrame:
    """``leaderboard`` of a list of trials (numbered 0, 1, ... as a study numbers them); ``model``, ``ranking`` and
    ``scores``: the shrinkage fit, the board's order and the scores of these trials when the caller has them."""
    scores = scores_by_shape(trials) if scores is None else scores
    if not scores:
        return pd.DataFrame()
    base = scores.get(baseline_key)
    adjusted = seed_adjusted_means(scores, baseline_key)
    base_at = mean_by_seed(base) if base is not None else {}
    board_order = ranking if ranking is not None else rank_shapes(scores, baseline_key, model)
    ranked, gains = board_order.ranked, board_order.gains
    rows = []
    for key in board_order.order:
        shape, gain = scores[key], gains.get(key)
        interval = gain.interval_pct(base.mean) if gain is not None and base else None
        attrs = [trials[n].user_attrs for n in shape.trials]
        first = attrs[0]
        mean, adj = shape.mean, adjusted[key]
        speeds = [a["tokens_per_s"] for a in attrs if a.get("tokens_per_s") is not None]
        rows.append({
            "heads": format_plateaus(first["heads"]), "k": first.get("k"), "d_h": first.get("d_h"),
            "d_model": first.get("d_model"), "layers": first.get("layers"), "seeds": shape.n,
            "ranked_loss": ranked[key],
            "expected_gain_pct": gain.gain_pct(base.mean) if gain is not None and base else None,
            "expected_gain_low": interval[0] if interval else None,
            "expected_gain_high": interval[1] if interval else None,
            "shrink": gain.weight if gain is not None else None,
            "adjusted_loss": adj, "mean_loss": mean, "ci95": ci95(shape.losses),
            "loss_on_baseline_seeds": loss_on_seeds(shape, base_at), "baseline_seeds": shared(shape, base_at),
            "gain_pct": 100 * (base.mean - adj) / base.mean if base else None,
            # the median: one run slowed by a neighbour on the machine moves it least
            "params": first.get("params"), "tokens_per_s": median(speeds) if speeds else None,
            "trials": ",".join(map(str, shape.trials)), "is_baseline": key == baseline_key, "key": key,
            "arch": first.get("arch"),
        })
    board = pd.DataFrame(rows)  # already in the ranking's order
    board.insert(0, "rank", range(1, len(board) + 1))
    if top is not None:
        board = board[(board.index < top) | board["is_baseline"]]
    return board


def shared(shape: ShapeScores, base_at: dict[int, float]) -> int:
    """How many of ``shape``'s seeds the baseline trained too."""
    return len(set(shape.seeds) & set(base_at))


def loss_on_seeds(shape: ShapeScores, base_at: dict[int, float]) -> float | None:
    """``shape``'s mean loss over the seeds the baseline trained too (what compares with the baseline's mean on the
    same seeds, unlike its mean over seeds the baseline never saw); None without a common seed."""
    by_seed = mean_by_seed(shape)
    common = [by_seed[s] for s in by_seed if s in base_at]
    return fmean(common) if common else None


def expected_gain_text(row: Any) -> str:
    """A board row's shrunk gain: ``+0.31 % [-0.20, +0.82]`` (95 % posterior), ``-`` for the baseline."""
    value, low, high = (getattr(row, name, None) for name in ("expected_gain_pct", "expected_gain_low",
                                                            "expected_gain_high"))
    if getattr(row, "is_baseline", False) or value is None or value != value:
        return "-"
    if low is None or low != low:
        return f"{value:+.2f} % (not shrunk yet)"
    return f"{value:+.2f} % [{low:+.2f}, {high:+.2f}]"
