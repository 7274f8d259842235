"""``nas export``: the best shapes as JSON rows, each with its shape and the proxy's scores and intervals.

A row is a valid ``nas train --config`` (its ``arch``, with ``kv_heads`` when grouped), and a list of
rows is a leaderboard (``--rank``); ``kv_heads`` and ``kv_cache_bytes_per_token`` are each shape's keys and
values per layer and what they cost an inference. Scores: mean loss over seeds with its 95 % interval, the
gain of the means, the paired gain over the baseline on common seeds without the selecting seed
(``nas.stats.evidence.Evidence.honest_gain``), whether the shape is tied with the best, and whether it is the
answer's pick (``is_answer_pick``: after a race, the race's winner, which the board's shrunk ranking need not put
first).
"""

from __future__ import annotations

import math
from typing import Any

from nas.arch import ArchConfig, format_plateaus
from reports.frame import StudyData
from reports.summary import shape_label


def _number(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, float) and value == 0:
        return 0.0  # not -0.0: the baseline's gain over itself printed as "-0.0"
    return None if isinstance(value, float) and not math.isfinite(value) else value


def export_rows(data: StudyData, top: int) -> list[dict[str, Any]]:
    """The ``top`` best shapes and the baseline, ranked (see the module docstring)."""
    if data.board.empty:
        return []
    answer = data.answer()
    tied = set(answer.tied)
    rows = []
    for r in data.shown(top).itertuples():
        gain = data.evidence.honest_gain(r.key) if r.key != data.baseline_key else None
        arch = ArchConfig.from_dict(r.arch) if isinstance(r.arch, dict) else None
        rows.append({
            "rank": int(r.rank), "shape": shape_label(data, r.key), "heads": r.heads,
            "kv_heads": format_plateaus(arch.kv_per_layer()) if arch else None,
            "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token() if arch else None, "k": _number(r.k),
            "d_h": _number(r.d_h), "d_model": _number(r.d_model), "layers": _number(r.layers), "seeds": int(r.seeds),
            "ranked_loss": _number(r.ranked_loss), "expected_gain_pct": _number(r.expected_gain_pct),
            "expected_gain_low": _number(r.expected_gain_low), "expected_gain_high": _number(r.expected_gain_high),
            "shrink": _number(r.shrink),
            "adjusted_loss": _number(r.adjusted_loss), "mean_loss": _number(r.mean_loss), "ci95": _number(r.ci95),
            "loss_on_baseline_seeds": _number(r.loss_on_baseline_seeds), "baseline_seeds": int(r.baseline_seeds),
            "gain_pct": _number(r.gain_pct),
            "paired_gain_pct": gain.gain_pct if gain else None, "paired_gain_low": gain.low_pct if gain else None,
            "paired_gain_high": gain.high_pct if gain else None, "paired_seeds": gain.n if gain else 0,
            "tied_with_best": r.key in tied, "is_answer_pick": r.key == answer.best, "params": _number(r.params),
            "tokens_per_s": _number(r.tokens_per_s), "trials": r.trials, "is_baseline": bool(r.is_baseline),
            "key": r.key, "study": data.name, "space": data.space_name, "preset": data.preset, "arch": r.arch,
        })
    return rows
