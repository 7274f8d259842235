"""The board read off the shrinkage model (``nas.stats.shrinkage``): every shape's shrunk gain over the baseline with
its robust credible interval, and the board's order, which the leaderboard, the planner and the answer all read.

A shape's gain is ``theta_s = m_s - m_base`` (nats; negative: better), its posterior mean and 95 % interval from one
fit of the two-way model; the board ranks by ``L_base + E[theta_s]`` (the baseline's own mean loss plus the expected
gain), so a shape on one lucky seed keeps only the share of its lead that its seeds support.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nas.stats.scores import ShapeScores, seed_adjusted_means
from nas.stats.shrinkage import Fit, Prior, fit


@dataclass(frozen=True)
class ShrunkGain:
    """One shape's difference from the baseline, seed-adjusted and shrunk (nats; negative: better)."""

    n: int  # seeds
    raw: float  # seed-adjusted loss minus the baseline's mean
    posterior: float  # E[theta_s | data]
    low: float | None  # 95 % interval of theta_s (None when nothing is shrunk)
    high: float | None
    weight: float  # B (Prior.weight)
    widening: float = 1.0  # (high - posterior) over the normal prior's half-width (>= 1): the end that decides "better"

    def gain_pct(self, base_mean: float) -> float:
        return -100 * self.posterior / base_mean

    def interval_pct(self, base_mean: float) -> tuple[float, float] | None:
        """The interval of the gain in % of the baseline's mean loss (low, high)."""
        if self.low is None or self.high is None:
            return None
        return -100 * self.high / base_mean, -100 * self.low / base_mean


@dataclass(frozen=True)
class Ranking:
    """The board's order (best first), the loss it ranks by, and every shape's ``ShrunkGain``."""

    order: list[str]
    ranked: dict[str, float]
    gains: dict[str, ShrunkGain]
    prior: Prior | None


def shrunk_gains(scores: dict[str, ShapeScores], baseline_key: str | None,
                 known: tuple[float, float] | None = None) -> tuple[dict[str, ShrunkGain], Prior | None]:
    """Every shape's ``ShrunkGain`` (the baseline's is 0 by definition) and the variance components used."""
    if baseline_key is None or baseline_key not in scores:
        return {}, None
    model = fit(scores, known=known, baseline=baseline_key)
    if model is None:
        return {}, None
    return _gains_of(model, scores, baseline_key), model.prior


def _gains_of(model: Fit, scores: dict[str, ShapeScores], baseline_key: str) -> dict[str, ShrunkGain]:
    """Every shape's ``ShrunkGain`` from one fit. Its interval is robust to the prior's tails: the union of the 95 %
    credible intervals under the normal prior and under the heavy-tailed one (``nas.stats.shrinkage.heavy_tailed``),
    the range over a class of priors that robust Bayesian analysis reports (Berger, "Robust Bayesian analysis:
    sensitivity to the prior", J. Stat. Plan. Inference 1990). The normal prior's alone covered the pick's true
    gain in 0.90-0.94 of figure 10's studies at the measured noise, its misses mostly on the side of a larger gain
    (the best shape shrunk back too far); the heavy-tailed one's alone missed as often, on both sides."""
    adjusted = seed_adjusted_means(scores, baseline_key)
    base_mean = scores[baseline_key].mean
    b = model.keys.index(baseline_key)
    variances = model.variances(b)
    heavy = model.heavy if model.prior.shrinks else model
    heavy_variances = heavy.variances(b)
    out = {}
    for k, key in enumerate(model.keys):
        raw = adjusted[key] - base_mean
        if not model.prior.shrinks or variances is None or heavy_variances is None:
            out[key] = ShrunkGain(scores[key].n, raw, raw, None, None, 1.0)
            continue
        posterior = float(model.m[k] - model.m[b])
        half = model.quantile * math.sqrt(max(0.0, float(variances[k])))
        robust = float(heavy.m[k] - heavy.m[b])
        robust_half = model.quantile * math.sqrt(max(0.0, float(heavy_variances[k])))
        low, high = min(posterior - half, robust - robust_half), max(posterior + half, robust + robust_half)
        out[key] = ShrunkGain(scores[key].n, raw, posterior, low, high,
                              1.0 if k == model.fixed else model.prior.weight(scores[key].n),
                              (high - posterior) / half if half > 0 else 1.0)
    return out


def rank_shapes(scores: dict[str, ShapeScores], baseline_key: str | None, model: Fit | None = None,
                intervals: bool = True) -> Ranking:
    """The board in one fit: shapes best first by ``L_base + E[theta_s]`` (module docstring; every shape of a study
    without a baseline keeps its plain mean), ties broken by the seed-adjusted loss, then by the plain mean.
    ``model``: a fit of these scores already made (``fit(scores, baseline=baseline_key)``), so a reader fits once.
    ``intervals=False``: the order and the ranked losses only (``gains`` empty), what the planner reads at every
    trial."""
    adjusted = seed_adjusted_means(scores, baseline_key)
    if model is None and baseline_key in scores:
        model = fit(scores, baseline=baseline_key)
    if model is None or baseline_key not in scores:
        order = sorted(scores, key=lambda k: (adjusted[k], scores[k].mean))
        return Ranking(order, adjusted, {}, None)
    base = scores[baseline_key].mean  # type: ignore[index]
    gains = _gains_of(model, scores, baseline_key) if intervals else {}  # type: ignore[arg-type]
    if model.prior.shrinks:
        b = model.keys.index(baseline_key)  # type: ignore[arg-type]
        ranked = {key: base + float(model.m[k] - model.m[b]) for k, key in enumerate(model.keys)}
    else:
        ranked = {key: base + (adjusted[key] - base) for key in scores}
    order = sorted(scores, key=lambda k: (round(ranked[k], 12), adjusted[k], scores[k].mean))
    return Ranking(order, ranked, gains, model.prior)


def ranked_losses(scores: dict[str, ShapeScores], baseline_key: str | None) -> dict[str, float]:
    """The loss every reader ranks shapes by (``rank_shapes``)."""
    return rank_shapes(scores, baseline_key, intervals=False).ranked


def ranking(scores: dict[str, ShapeScores], baseline_key: str | None) -> list[str]:
    """Shape keys best first (``rank_shapes``)."""
    return rank_shapes(scores, baseline_key, intervals=False).order


def lowest_ranked_loss(scores: dict[str, ShapeScores], baseline_key: str | None) -> float:
    """``min(ranked_losses(...).values())`` without the intervals: what the report's history line draws after
    every training (a thousand fits of a thousand-trial study)."""
    if baseline_key not in scores:
        return min(shape.mean for shape in scores.values())
    model = fit(scores, baseline=baseline_key)
    if model is None or not model.prior.shrinks:
        return min(seed_adjusted_means(scores, baseline_key).values())
    b = model.keys.index(baseline_key)  # type: ignore[arg-type]
    return scores[baseline_key].mean + float(np.min(model.m) - model.m[b])  # type: ignore[index]
