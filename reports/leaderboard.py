"""The leaderboard: one row per shape, mean validation loss over seeds with a 95% confidence interval.

``ci95 = t_{0.975, n-1} * s / sqrt(n)`` (Student's t, sample standard deviation ``s`` over the
shape's seed replicates; none for a single seed). ``gain_pct = 100 (L_base - L) / L_base``:
positive when the shape beats the baseline's mean loss.
"""

from __future__ import annotations

import math
from statistics import mean, stdev

import optuna
import pandas as pd
from optuna.trial import TrialState

# two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30; 1.96 beyond
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def ci95(values: list[float]) -> float | None:
    return t975(len(values) - 1) * stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def completed_trials(study: optuna.Study) -> pd.DataFrame:
    """One row per trained, completed (not pruned, not duplicate) trial, with its shape and scores."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if "duplicate_of" in a or "key" not in a:
            continue
        rows.append({"number": t.number, "key": a["key"], "seed": a.get("seed", 0), "role": a.get("role"),
                     "loss": t.values[0], "heads": a.get("heads"), "k": a.get("k"), "d_h": a.get("d_h"),
                     "d_model": a.get("d_model"), "layers": a.get("layers"), "params": a.get("params"),
                     "tokens_per_s": a.get("tokens_per_s"), "d_model_per_layer": a.get("d_model_per_layer"),
                     "d_h_over_d_model": a.get("d_h_over_d_model")})
    return pd.DataFrame(rows)


def leaderboard(study: optuna.Study, top: int | None = None) -> pd.DataFrame:
    """Shapes ranked by mean loss; the baseline row is always included (``is_baseline``)."""
    from nas.arch import format_plateaus  # the one formatting of head schedules

    trials = completed_trials(study)
    if trials.empty:
        return pd.DataFrame()
    baseline_key = study.user_attrs.get("nas:baseline_key")
    base = trials.loc[trials["key"] == baseline_key, "loss"].tolist()
    base_mean = mean(base) if base else None
    rows = []
    for key, group in trials.groupby("key", sort=False):
        losses = group["loss"].tolist()
        first = group.iloc[0]
        rows.append({
            "heads": format_plateaus(first["heads"]), "k": first["k"], "d_h": first["d_h"],
            "d_model": first["d_model"], "layers": first["layers"], "seeds": len(losses),
            "mean_loss": mean(losses), "ci95": ci95(losses),
            "gain_pct": 100 * (base_mean - mean(losses)) / base_mean if base_mean else None,
            "params": first["params"], "tokens_per_s": group["tokens_per_s"].mean(),
            "trials": ",".join(map(str, group["number"])), "is_baseline": key == baseline_key, "key": key,
        })
    board = pd.DataFrame(rows).sort_values("mean_loss", kind="stable").reset_index(drop=True)
    board.insert(0, "rank", range(1, len(board) + 1))
    if top is not None:
        board = board[(board.index < top) | board["is_baseline"]]
    return board
