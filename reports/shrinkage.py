"""The ranking: every shape's gain over the baseline, shrunk by what its seeds support (empirical Bayes).

A shape that tops the first pass on one seed is mostly lucky: its one score is its true mean plus a
noise as large as the spread of the true means. The seed-adjusted loss
(``nas.study.records.seed_adjusted_means``) removes the seed's shared luck but not this selection, so
a board ranked by it fills its top with one-seed shapes that races then find behind the baseline.
The ranking here is the posterior mean of a two-way random-effects model of every score of the
study (the best linear unbiased predictor of Henderson's mixed-model equations; Robinson, "That BLUP
is a good thing", Statistical Science 1991)::

    L_s,i = m_s + u_i + e_s,i        u_i: seed i's effect, shared by every shape trained on it (free)
                                     m_s ~ N(0, tau^2): shape s's true level, the baseline one of them
                                     e_s,i ~ N(0, s2): the run's own luck
    theta_s = m_s - m_base           (negative: s is better than the baseline)

``s2`` is the residual variance of the fixed-effects fit (shape + seed, least squares), ``tau^2`` the
moment estimate ``max(0, var(m_hat) - s2 mean(1 / n_s))`` from that fit's shape effects (``n_s`` the
shape's seeds). The posterior mean of ``(m, u)`` then solves the mixed-model equations with
``lambda = s2 / tau^2``::

    [Z'Z + lambda I   Z'X] [m]   [Z'y]
    [X'Z             X'X] [u] = [X'y]        posterior covariance s2 * (that matrix)^-1

where ``Z`` and ``X`` mark each score's shape and seed. ``Z'Z`` is diagonal, so ``m`` is eliminated
(a Schur complement over the few seeds): a study of a thousand shapes solves in milliseconds. In
words: a shape with ``n`` seeds keeps about ``B = tau^2 / (tau^2 + s2 / n)`` of its own lead (at the
default proxy's noise, about a quarter for one seed and three quarters for nine), the seed effects are
read off every shape trained on a seed (not off the baseline's one run there), and the baseline is
shrunk like any member. The ranked loss is ``L_base + E[theta_s]``, with a 95 % interval from the
posterior variance of ``theta_s`` (the variance components' own estimation error is left out:
``tests/test_shrinkage.py`` measures the coverage on known truths). Until ``s2`` can be estimated
(no shape has two seeds) nothing is shrunk and the ranking is the seed-adjusted loss; when ``tau``
comes out 0 every shape is shrunk to the same level, ties are broken by the seed-adjusted loss, and the
intervals are the unshrunk fit's: the data order nothing, and say so.
``benchmarks/ranking_simulation.py`` measures the ranking against the truth (its correlation with the
true means, the regret of its top shape) beside the seed-adjusted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from nas.study.records import ShapeScores, mean_by_seed, seed_adjusted_means
from reports.statistics import ALPHA

Z = NormalDist().inv_cdf(1 - ALPHA / 2)
LOG_LAMBDA_MAX = 9.0  # REML searches lam = s2 / tau^2 in [e^-9, e^9]; past e^9 the fit says tau = 0


@dataclass(frozen=True)
class Prior:
    """The variance components the shrinkage was estimated with."""

    tau: float  # sd of the shapes' true levels (nats)
    sigma: float | None  # sd of one run's own luck; None: not estimable yet (nothing is shrunk)
    shapes: int

    @property
    def shrinks(self) -> bool:
        return self.sigma is not None

    def weight(self, n: int) -> float:
        """``B``: about how much of its own lead a shape with ``n`` seeds keeps."""
        if self.sigma is None or n <= 0:
            return 1.0
        noise = self.sigma**2 / n
        return self.tau**2 / (self.tau**2 + noise) if self.tau**2 + noise > 0 else 1.0


@dataclass(frozen=True)
class ShrunkGain:
    """One shape's difference from the baseline, seed-adjusted and shrunk (nats; negative: better)."""

    n: int  # seeds
    raw: float  # seed-adjusted loss minus the baseline's mean
    posterior: float  # E[theta_s | data]
    low: float | None  # 95 % interval of theta_s (None when nothing is shrunk)
    high: float | None
    weight: float  # B (Prior.weight)

    def gain_pct(self, base_mean: float) -> float:
        return -100 * self.posterior / base_mean

    def interval_pct(self, base_mean: float) -> tuple[float, float] | None:
        """The interval of the gain in % of the baseline's mean loss (low, high)."""
        if self.low is None or self.high is None:
            return None
        return -100 * self.high / base_mean, -100 * self.low / base_mean


@dataclass(frozen=True)
class Fit:
    """The model's estimates for the shapes ``keys``: posterior means of ``m``, the variance components, and what
    a contrast's variance needs (``D``, ``R`` and the Schur complement's inverse of ``_normal_equations``)."""

    keys: list[str]
    m: np.ndarray  # (S,) shape levels (posterior means; the fixed-effects fit when nothing is shrunk)
    prior: Prior
    d: np.ndarray | None = None  # (S,)
    r: np.ndarray | None = None  # (S, I) or (S, I - 1)
    inverse: np.ndarray | None = None
    limit: np.ndarray | None = None  # (S,) when tau = 0: the levels' order as tau -> 0+, which breaks the flat ties

    def variance(self, k: int, b: int) -> float | None:
        """Posterior variance of ``m_k - m_b``: ``s2 (1/D_k + 1/D_b + (R_k - R_b)' S^-1 (R_k - R_b))``; None when
        nothing is shrunk."""
        if self.d is None or self.r is None or self.inverse is None or self.prior.sigma is None:
            return None
        if k == b:
            return 0.0
        rc = self.r[k] - self.r[b]
        return self.prior.sigma**2 * float(1 / self.d[k] + 1 / self.d[b] + rc @ self.inverse @ rc)

    def draws(self, rng: np.random.Generator, n: int) -> np.ndarray | None:
        """``n`` joint draws of the shape levels from their posterior, ``(n, S)``; None when nothing is shrunk.

        Exact for the Gaussian posterior of the mixed-model equations: the seed effects first,
        ``u ~ N(u_hat, s2 S^-1)``, then every shape given them, independently,
        ``m_s | u ~ N(m_hat_s - R_s (u - u_hat), s2 / D_s)``."""
        if self.d is None or self.r is None or self.inverse is None or self.prior.sigma is None:
            return None
        sigma = self.prior.sigma
        covariance = sigma**2 * (self.inverse + self.inverse.T) / 2  # (I, I)
        values, vectors = np.linalg.eigh(covariance)
        factor = vectors * np.sqrt(np.clip(values, 0.0, None))  # (I, I): factor @ factor.T = covariance
        du = rng.standard_normal((n, len(values))) @ factor.T  # (n, I): u - u_hat
        own = rng.standard_normal((n, len(self.keys))) * (sigma / np.sqrt(self.d))  # (n, S)
        return self.m[None, :] - du @ self.r.T + own


@dataclass(frozen=True)
class Ranking:
    """The board's order (best first), the loss it ranks by, and every shape's ``ShrunkGain``."""

    order: list[str]
    ranked: dict[str, float]
    gains: dict[str, ShrunkGain]
    prior: Prior | None


class _Solution(NamedTuple):
    m: np.ndarray  # (S,) shape levels
    u: np.ndarray  # (I,) seed effects
    d: np.ndarray  # (S,) Z'Z + lam (diagonal)
    r: np.ndarray  # (S, I) D^-1 Z'X (the last column dropped when lam = 0)
    inverse: np.ndarray  # the Schur complement's inverse
    logdet: float  # log |Schur complement| = log |X' H^-1 X|, H = I + Z Z' / lam (for the REML likelihood)
    quadratic: float  # y'y - m'Z'y - u'X'y: (n - p) s2 at this lam (Henderson)


def _normal_equations(shape: np.ndarray, seed: np.ndarray, y: np.ndarray, n_shapes: int, n_seeds: int,
                      lam: float) -> _Solution:
    """``m`` and ``u`` of the mixed-model equations (module docstring) with ridge ``lam`` on ``m`` (0: the
    fixed-effects fit, its last seed effect pinned to 0), and what variances and the likelihood need: ``D``
    (Z'Z + lam, diagonal), ``R = D^-1 Z'X``, the Schur complement's inverse and log-determinant."""
    d = np.bincount(shape, minlength=n_shapes).astype(float) + lam  # (S,)
    zx = np.zeros((n_shapes, n_seeds))  # (S, I) runs of each shape at each seed
    np.add.at(zx, (shape, seed), 1.0)
    zy = np.bincount(shape, weights=y, minlength=n_shapes)  # (S,)
    xy = np.bincount(seed, weights=y, minlength=n_seeds)  # (I,)
    xx = np.bincount(seed, minlength=n_seeds).astype(float)  # (I,)
    r = zx / d[:, None]  # (S, I)
    schur = np.diag(xx) - zx.T @ r  # (I, I)
    rhs = xy - r.T @ zy  # (I,)
    if lam == 0:  # shape and seed effects are identified up to one shared constant: pin the last seed's
        schur, rhs = schur[:-1, :-1], rhs[:-1]
    inverse = np.linalg.pinv(schur)
    u = inverse @ rhs
    logdet = float(np.linalg.slogdet(schur)[1]) if lam > 0 else 0.0
    if lam == 0:
        u = np.append(u, 0.0)
        r = r[:, :-1]
    m = (zy - zx @ u) / d
    return _Solution(m, u, d, r, inverse, logdet, float(y @ y - m @ zy - u @ xy))


def _reml(shape: np.ndarray, seed: np.ndarray, y: np.ndarray, n_shapes: int, n_seeds: int) -> tuple[float, float]:
    """``(tau^2, s2)`` by restricted maximum likelihood (Patterson and Thompson 1971), the seed effects fixed::

        -2 l_R(lam) = (n - p) log(q(lam) / (n - p)) + sum_s log(1 + n_s / lam) + log |X' H^-1 X|,
        lam = s2 / tau^2,  s2 = q(lam) / (n - p),  H = I + Z Z' / lam,  p = the number of seeds,

    ``q`` the quadratic of Henderson's equations at ``lam``, maximised over ``log lam`` on a grid, then by golden
    section. A likelihood, unlike the moment estimate from the fixed-effects fit, is not biased by the adaptive
    choice of which shapes get more seeds (a choice made on observed scores is ignorable for the likelihood); the
    moment estimate's ``s2`` is inflated by the selected seed of every shape that was replicated because it was
    lucky, and so it over-shrinks."""
    n, p = len(y), n_seeds
    seeds_per_shape = np.bincount(shape, minlength=n_shapes).astype(float)  # (S,)

    def deviance(log_lam: float) -> float:
        lam = math.exp(log_lam)
        sol = _normal_equations(shape, seed, y, n_shapes, n_seeds, lam)
        q = max(sol.quadratic, 1e-300)
        return (n - p) * math.log(q / (n - p)) + float(np.sum(np.log1p(seeds_per_shape / lam))) + sol.logdet

    grid = np.linspace(-LOG_LAMBDA_MAX, LOG_LAMBDA_MAX, 19)
    values = [deviance(x) for x in grid]
    i = int(np.argmin(values))
    low, high = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    golden = (math.sqrt(5) - 1) / 2
    a, b = high - golden * (high - low), low + golden * (high - low)
    fa, fb = deviance(a), deviance(b)
    for _ in range(16):
        if fa < fb:
            high, b, fb = b, a, fa
            a = high - golden * (high - low)
            fa = deviance(a)
        else:
            low, a, fa = a, b, fb
            b = low + golden * (high - low)
            fb = deviance(b)
    log_lam = (low + high) / 2
    if i == len(grid) - 1 and log_lam > grid[-2]:  # the likelihood is flattest at no spread: tau^2 = 0
        sol = _normal_equations(shape, seed, y, n_shapes, n_seeds, math.exp(grid[-1]))
        return 0.0, sol.quadratic / (n - p)
    lam = math.exp(log_lam)
    s2 = _normal_equations(shape, seed, y, n_shapes, n_seeds, lam).quadratic / (n - p)
    return s2 / lam, s2


def fit(scores: dict[str, ShapeScores], min_tau_ratio: float = 0.0) -> Fit | None:
    """The two-way model fitted to every shape's per-seed scores (a seed trained twice counts with its mean).

    ``min_tau_ratio`` floors ``tau`` at that fraction of ``sigma`` (0: the estimate as it is). The board keeps 0;
    the allocation (``nas.study.adaptive``) floors it, so that an estimate of 0 early in a study (one seed a
    shape, a noisy ``s2``) does not freeze every shape at one level and stop the search exploring."""
    keys = list(scores)
    seeds = sorted({s for shape in scores.values() for s in shape.seeds})
    if not keys:
        return None
    seed_index = {s: i for i, s in enumerate(seeds)}
    rows = [(k, seed_index[s], loss) for k, key in enumerate(keys) for s, loss in mean_by_seed(scores[key]).items()]
    shape, seed, y = (np.array(c) for c in zip(*rows))
    shape, seed, y = shape.astype(int), seed.astype(int), y.astype(float)
    fixed = _normal_equations(shape, seed, y, len(keys), len(seeds), 0.0)
    df = len(y) - len(keys) - len(seeds) + 1
    if df <= 0 or len(keys) < 3:
        return Fit(keys, fixed.m, Prior(0.0, None, len(keys)))
    tau2, s2 = _reml(shape, seed, y, len(keys), len(seeds))
    tau2 = max(tau2, (min_tau_ratio**2) * s2)
    prior = Prior(math.sqrt(tau2), math.sqrt(s2), len(keys))
    if tau2 == 0.0:  # one level for every shape; its intervals are the unshrunk fit's (the data order nothing)
        # the limit of the posterior order as tau -> 0+: a shape's level moves from the common one by about
        # n_s tau^2 / s2 times its mean residual, so the flat ties go to the shape whose seeds *together* say most
        # (not to the luckiest single seed, which the plain seed-adjusted loss would reward)
        limit = _normal_equations(shape, seed, y, len(keys), len(seeds), math.exp(LOG_LAMBDA_MAX)).m
        return Fit(keys, np.full(len(keys), float(np.mean(fixed.m))), prior, fixed.d, fixed.r, fixed.inverse, limit)
    sol = _normal_equations(shape, seed, y, len(keys), len(seeds), s2 / tau2)
    return Fit(keys, sol.m, prior, sol.d, sol.r, sol.inverse)


def shrunk_gains(scores: dict[str, ShapeScores],
                 baseline_key: str | None) -> tuple[dict[str, ShrunkGain], Prior | None]:
    """Every shape's ``ShrunkGain`` (the baseline's is 0 by definition) and the variance components used."""
    if baseline_key is None or baseline_key not in scores:
        return {}, None
    model = fit(scores)
    if model is None:
        return {}, None
    return _gains_of(model, scores, baseline_key), model.prior


def _gains_of(model: Fit, scores: dict[str, ShapeScores], baseline_key: str) -> dict[str, ShrunkGain]:
    """Every shape's ``ShrunkGain`` from one fit."""
    adjusted = seed_adjusted_means(scores, baseline_key)
    base_mean = scores[baseline_key].mean
    b = model.keys.index(baseline_key)
    out = {}
    for k, key in enumerate(model.keys):
        raw = adjusted[key] - base_mean
        if not model.prior.shrinks:
            out[key] = ShrunkGain(scores[key].n, raw, raw, None, None, 1.0)
            continue
        posterior = float(model.m[k] - model.m[b])
        half = Z * math.sqrt(max(0.0, model.variance(k, b) or 0.0))
        out[key] = ShrunkGain(scores[key].n, raw, posterior, posterior - half, posterior + half,
                              model.prior.weight(scores[key].n))
    return out


def rank_shapes(scores: dict[str, ShapeScores], baseline_key: str | None) -> Ranking:
    """The board in one fit: shapes best first by ``L_base + E[theta_s]`` (module docstring; every shape of a study
    without a baseline keeps its plain mean), ties (every shape shrunk to one level) broken by the order the levels
    take as ``tau -> 0+`` (``Fit.limit``), then by the seed-adjusted loss and the plain mean."""
    adjusted = seed_adjusted_means(scores, baseline_key)
    model = fit(scores) if baseline_key in scores else None
    if model is None:
        order = sorted(scores, key=lambda k: (adjusted[k], scores[k].mean))
        return Ranking(order, adjusted, {}, None)
    gains = _gains_of(model, scores, baseline_key)  # type: ignore[arg-type]
    base = scores[baseline_key].mean  # type: ignore[index]
    ranked = {key: base + gains[key].posterior for key in scores}
    limit = dict(zip(model.keys, model.limit)) if model.limit is not None else adjusted
    order = sorted(scores, key=lambda k: (round(ranked[k], 12), round(float(limit[k]), 12), adjusted[k],
                                          scores[k].mean))
    return Ranking(order, ranked, gains, model.prior)


def ranked_losses(scores: dict[str, ShapeScores], baseline_key: str | None) -> dict[str, float]:
    """The loss every reader ranks shapes by (``rank_shapes``)."""
    return rank_shapes(scores, baseline_key).ranked


def ranking(scores: dict[str, ShapeScores], baseline_key: str | None) -> list[str]:
    """Shape keys best first (``rank_shapes``)."""
    return rank_shapes(scores, baseline_key).order


def lowest_ranked_loss(scores: dict[str, ShapeScores], baseline_key: str | None) -> float:
    """``min(ranked_losses(...).values())`` without the intervals: what the report's history line draws after
    every training (a thousand fits of a thousand-trial study)."""
    if baseline_key not in scores:
        return min(shape.mean for shape in scores.values())
    model = fit(scores)
    if model is None or not model.prior.shrinks:
        return min(seed_adjusted_means(scores, baseline_key).values())
    b = model.keys.index(baseline_key)  # type: ignore[arg-type]
    return scores[baseline_key].mean + float(np.min(model.m) - model.m[b])  # type: ignore[index]
