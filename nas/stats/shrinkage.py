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

Given ``lambda = s2 / tau^2``, the posterior mean of ``(m, u)`` solves the mixed-model equations::

    [Z'Z + lambda I   Z'X] [m]   [Z'y]
    [X'Z             X'X] [u] = [X'y]        posterior covariance s2 * (that matrix)^-1

where ``Z`` and ``X`` mark each score's shape and seed. ``Z'Z`` is diagonal, so ``m`` is eliminated
(a Schur complement over the few seeds; ``nas.stats.mixed_model``): a study of a thousand shapes solves in
milliseconds; a study with more seeds than shapes eliminates the seeds instead (``X'X`` is diagonal too). In
words: a shape with ``n`` seeds keeps about ``B = tau^2 / (tau^2 + s2 / n)`` of its own lead (at the
default proxy's noise, about a quarter for one seed and three quarters for nine), the seed effects are
read off every shape trained on a seed (not off the baseline's one run there), and the baseline keeps its own
level: it is a fixed effect (no prior; REML with its column among the fixed effects, ``fit(baseline=)``). A user's
baseline is the convention, not a draw from the space's spread, and often among the best shapes (in the real default
search it is the posterior's pick). Shrunk like a member, it was pulled towards the pack's centre and every gain over
it leaned towards "better than the baseline": on known truths as flat as the real space with the baseline better than
95 % of the shapes (``benchmarks/ranking_simulation.py --baseline-z 1.645``; 300 studies, 71 replicate trials) the
pick's 95 % interval covered 0.907 of its true gains, 0.952 with the baseline fixed (0.973 with the true variance
components plugged in, where the shrunk baseline stayed at 0.888). The allocation's fit (``nas.stats.adaptive``)
keeps the baseline a member: unshrunk, its posterior variance ``s2 / n_base`` dwarfs a shrunk shape's, and the
knowledge gradient gave it 65 of 71 replicate trials. Held fixed on the board, it wins the board on luck more
often where it sits mid-spread, and on its two or three seeds after 24 replicate trials the pick's interval covers
0.907 there (benchmarks/RESULTS.md, "The baseline a fixed effect, shipped").

The variance components come from the study itself, by restricted maximum likelihood (REML, with
``s2`` profiled out; Patterson and Thompson 1971), which the adaptive choice of which shapes get more
seeds does not bias. With one seed for most shapes, ``tau^2`` and ``s2`` are barely separable, and a
plug-in of their point estimate gives intervals that are too short (the adaptive pick's 95 % interval
covered 80-83 % of known truths at 24 replicate trials). So the posterior is averaged over
``lambda``: a grid of ``log lambda`` (``LOG_LAMBDA_GRID``), each point weighted by its REML likelihood
times a flat prior on ``tau`` (Gelman, "Prior distributions for variance parameters in hierarchical
models", Bayesian Analysis 2006; flat in ``log lambda`` would pile weight on ``tau -> 0``, where the
likelihood is flat). The ranked loss is ``L_base + E[theta_s]``, with a 95 % interval from the mixture's
variance of ``theta_s`` (within the components plus between them), widened to the interval the same mixture
gives under a heavy-tailed prior (``heavy_tailed``, Student ``t_4``): the board's pick is the shape furthest
ahead, where a normal prior's tails are thinnest, and the normal prior's interval alone missed the pick's true
gain, mostly on the side of a larger one, in 6-10 % of figure 10's studies. Until ``s2`` can be estimated (no
shape has two seeds) nothing is shrunk and the ranking is the seed-adjusted loss. ``Prior`` reports the
REML point estimate (``tau = 0`` when the likelihood is flattest at no spread).
``benchmarks/ranking_simulation.py`` measures the ranking against the truth (its correlation with the
true means, the regret of its top shape) beside the seed-adjusted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist

import numpy as np
from scipy.special import stdtrit

from nas.stats.comparisons import ALPHA
from nas.stats.mixed_model import Design, Likelihood, Solution, design_sums, solve
from nas.stats.scores import ShapeScores, mean_by_seed

Z = NormalDist().inv_cdf(1 - ALPHA / 2)
LOG_LAMBDA_GRID = np.arange(-9.0, 9.0 + 1e-9, 0.5)  # lam = s2 / tau^2: the posterior's support; past e^9, tau = 0
MIN_COMPONENT_WEIGHT = 1e-6  # lighter components of the mixture are dropped (the rest renormalised)
ROBUST_NU = 4.0  # the heavy-tailed prior of the intervals' robust half: Student t_4 (Gelman et al., BDA3, ch. 17)
REWEIGHTINGS = 8  # reweighting passes of the heavy-tailed fit (heavy_tailed)


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
class Component:
    """One ``lambda = s2 / tau^2`` of the posterior mixture: its weight, its profiled ``s2`` and the solve there."""

    log_lam: float
    weight: float
    s2: float
    sol: Solution


@dataclass(frozen=True)
class Fit:
    """The model's estimates for the shapes ``keys``: posterior means of ``m`` (averaged over ``lambda``), the
    variance components' point estimate, and the mixture's components (none when nothing is shrunk)."""

    keys: list[str]
    m: np.ndarray  # (S,) shape levels (posterior means; the fixed-effects fit when nothing is shrunk)
    prior: Prior
    components: tuple[Component, ...] = ()
    df: int = 0  # the residual degrees of freedom of s2 (scores - seeds); 0: s2 known (no t widening)
    design: Design | None = None  # the sums the solves were made from (heavy_tailed solves again from them)
    fixed: int | None = None  # the shape whose level is a fixed effect, not shrunk (the baseline; module docstring)

    def ridge(self, log_lam: float) -> np.ndarray:
        """Every shape level's ridge in the mixed-model equations at ``log lambda``, ``(S,)``: ``lambda``, 0 for the
        fixed shape."""
        ridge = np.full(len(self.keys), math.exp(log_lam))
        if self.fixed is not None:
            ridge[self.fixed] = 0.0
        return ridge

    @cached_property
    def heavy(self) -> Fit:
        """This fit under the heavy-tailed prior (``heavy_tailed``), made once: every reader of one fit's
        intervals shares it."""
        return heavy_tailed(self)

    @property
    def quantile(self) -> float:
        """The two-sided 95 % quantile of a shape level's posterior: Student t with ``df`` (``s2`` integrated over
        its posterior under the prior 1 / s2, as REML estimates it from ``df`` residual degrees of freedom), the
        normal one when ``s2`` is known."""
        return credible_quantile(self.df)

    def variances(self, b: int) -> np.ndarray | None:
        """Posterior variance of every ``m_k - m_b``, ``(S,)``, by the law of total variance over the components:
        ``sum_j w_j (s2_j (1/D_k + 1/D_b + (R_k - R_b)' S^-1 (R_k - R_b)) + (diff_j,k - diff_k)^2)``; None when
        nothing is shrunk."""
        if not self.components:
            return None
        mean = self.m - self.m[b]  # (S,)
        total = np.zeros(len(self.keys))
        for c in self.components:
            rc = c.sol.r - c.sol.r[b]  # (S, I)
            within = c.s2 * (1 / c.sol.d + 1 / c.sol.d[b] + np.einsum("si,ij,sj->s", rc, c.sol.inverse, rc))
            total += c.weight * (within + (c.sol.m - c.sol.m[b] - mean) ** 2)
        total[b] = 0.0
        return total

    def marginals(self) -> tuple[np.ndarray, np.ndarray, float] | None:
        """Every shape level's posterior mean and variance, ``(S,)`` each, and the run noise ``s2`` (the components'
        weighted mean); None when nothing is shrunk. Per component ``Var(m_s) = s2 (1/D_s + R_s S^-1 R_s')`` (the
        seed effects' uncertainty included), mixed by the law of total variance."""
        if not self.components:
            return None
        total = np.zeros(len(self.keys))
        for c in self.components:
            within = c.s2 * (1 / c.sol.d + np.einsum("si,ij,sj->s", c.sol.r, c.sol.inverse, c.sol.r))
            total += c.weight * (within + (c.sol.m - self.m) ** 2)
        return self.m, total, float(sum(c.weight * c.s2 for c in self.components))

    def draws(self, rng: np.random.Generator, n: int) -> np.ndarray | None:
        """``n`` joint draws of the shape levels from their posterior, ``(n, S)``; None when nothing is shrunk.

        A component by its weight, then exactly its Gaussian posterior of the mixed-model equations: the seed
        effects first, ``u ~ N(u_hat, s2 S^-1)``, then every shape given them, independently,
        ``m_s | u ~ N(m_hat_s - R_s (u - u_hat), s2 / D_s)``."""
        if not self.components:
            return None
        per_component = rng.multinomial(n, [c.weight for c in self.components])
        out = []
        for c, count in zip(self.components, per_component):
            if count == 0:
                continue
            sigma = math.sqrt(c.s2)
            covariance = c.s2 * (c.sol.inverse + c.sol.inverse.T) / 2  # (I, I)
            values, vectors = np.linalg.eigh(covariance)
            factor = vectors * np.sqrt(np.clip(values, 0.0, None))  # (I, I): factor @ factor.T = covariance
            du = rng.standard_normal((count, len(values))) @ factor.T  # (count, I): u - u_hat
            own = rng.standard_normal((count, len(self.keys))) * (sigma / np.sqrt(c.sol.d))  # (count, S)
            out.append(c.sol.m[None, :] - du @ c.sol.r.T + own)
        return rng.permutation(np.concatenate(out))




def credible_quantile(df: int, alpha: float = ALPHA) -> float:
    """``t_{1 - alpha/2, df}`` (``Z`` for ``df`` <= 0: a known ``s2``)."""
    return float(stdtrit(df, 1 - alpha / 2)) if df > 0 else Z


def fit(scores: dict[str, ShapeScores], min_tau_ratio: float = 0.0, plug_in: bool = False,
        known: tuple[float, float] | None = None, baseline: str | None = None) -> Fit | None:
    """The two-way model fitted to every shape's per-seed scores (a seed trained twice counts with its mean).

    The posterior averages over ``lambda = s2 / tau^2`` (module docstring): a flat prior on ``log lambda`` over
    ``LOG_LAMBDA_GRID`` times the REML likelihood. ``min_tau_ratio`` restricts that prior to ``tau >= ratio *
    sigma`` (0: no restriction). The board keeps 0; the allocation (``nas.study.adaptive``) restricts it, so that
    a likelihood that favours no spread early in a study (one seed a shape, a noisy ``s2``) does not freeze every
    shape at one level and stop the search exploring. ``plug_in``: the posterior at the REML estimate alone (one
    component, empirical Bayes), the allocation's; narrower than the average, so its intervals under-cover
    (figure 10), but it spends replicates on fewer shapes. ``known`` (tau, sigma): the posterior at those variance
    components, estimated from nothing (``benchmarks/ranking_simulation.py`` plugs in its truth to separate how the
    components are estimated from how the pick is selected). ``baseline``: that shape's level is a fixed effect,
    estimated from its own scores and not shrunk (module docstring); every reader passes the study's baseline."""
    keys = list(scores)
    seeds = sorted({s for shape in scores.values() for s in shape.seeds})
    if not keys:
        return None
    seed_index = {s: i for i, s in enumerate(seeds)}
    rows = [(k, seed_index[s], loss) for k, key in enumerate(keys) for s, loss in mean_by_seed(scores[key]).items()]
    shape, seed, y = (np.array(c) for c in zip(*rows))
    shape, seed, y = shape.astype(int), seed.astype(int), y.astype(float)
    df = len(y) - len(keys) - len(seeds) + 1
    if df <= 0 or len(keys) < 3:
        fixed = solve(design_sums(shape, seed, y, len(keys), len(seeds)), 0.0)
        return Fit(keys, fixed.m, Prior(0.0, None, len(keys)))
    fixed = keys.index(baseline) if baseline in scores else None
    likelihood = Likelihood(shape, seed, y, len(keys), len(seeds), fixed)
    if known is not None:
        tau, sigma = known
        log_lam = math.log(sigma**2 / max(tau, 1e-12) ** 2)
        sol = likelihood.at(log_lam)[2]
        return Fit(keys, sol.m, Prior(tau, sigma, len(keys)), (Component(log_lam, 1.0, sigma**2, sol),), 0,
                   likelihood.design, fixed)
    cap = -2 * math.log(min_tau_ratio) if min_tau_ratio > 0 else math.inf  # tau >= r sigma <=> log lam <= -2 log r
    grid = LOG_LAMBDA_GRID[LOG_LAMBDA_GRID <= cap]
    if len(grid) == 0 or grid[-1] < min(cap, LOG_LAMBDA_GRID[-1]):
        grid = np.append(grid, min(cap, LOG_LAMBDA_GRID[-1]))
    evaluated = [likelihood.at(x) for x in grid]
    deviances = np.array([e[0] for e in evaluated])
    taus = np.sqrt([s2 / math.exp(x) for x, (_, s2, _) in zip(grid, evaluated)])  # (G,)
    weights = np.exp(-(deviances - deviances.min()) / 2) * taus  # flat in tau: d tau / d log lam = -tau / 2
    weights /= weights.sum()
    components = tuple(Component(float(x), float(w), s2, sol)
                       for x, w, (_, s2, sol) in zip(grid, weights, evaluated) if w > MIN_COMPONENT_WEIGHT)
    total = sum(c.weight for c in components)
    components = tuple(Component(c.log_lam, c.weight / total, c.s2, c.sol) for c in components)
    m = np.sum([c.weight * c.sol.m for c in components], axis=0)  # (S,)
    log_lam = likelihood.mode(grid, deviances)
    _, s2_mode, mode_sol = likelihood.at(log_lam)
    at_the_end = log_lam > grid[-2] and np.argmin(deviances) == len(grid) - 1 and not math.isfinite(cap)
    tau2 = 0.0 if at_the_end else s2_mode / math.exp(log_lam)  # flattest at no spread: tau^2 = 0
    prior = Prior(math.sqrt(tau2), math.sqrt(s2_mode), len(keys))
    if plug_in and not at_the_end:
        return Fit(keys, mode_sol.m, prior, (Component(log_lam, 1.0, s2_mode, mode_sol),), likelihood.df,
                   likelihood.design, fixed)
    return Fit(keys, m, prior, components, likelihood.df, likelihood.design, fixed)


def heavy_tailed(model: Fit, nu: float = ROBUST_NU, passes: int = REWEIGHTINGS) -> Fit:
    """``model`` with the shape levels' prior ``t_nu(0, tau^2)`` in place of ``N(0, tau^2)``: every component keeps
    its ``lambda`` (so the same scale ``tau``), weight and ``s2``; the prior's shape changes, its tails above all.

    A normal prior pulls every shape towards the pack by the same share, however far its seeds put it: a shape
    that is truly exceptional (the best of a space often is) is pulled back too far, and its interval misses its
    gain on the side of a larger one. A t prior is a scale mixture of normals, ``m_s | w_s ~ N(0, tau^2 / w_s)``,
    ``w_s ~ Gamma(nu / 2, nu / 2)``; given the ``w``'s the mixed-model equations hold with one ridge a shape,
    ``lambda w_s``, and each ``w_s`` is re-estimated from its shape's posterior (the EM step of Lange, Little and
    Taylor, "Robust statistical modeling using the t distribution", JASA 1989)::

        w_s = (nu + 1) / (nu + (m_s^2 + Var(m_s)) / tau^2)

    so a shape far from the pack on many seeds is shrunk less, one near it as before. The posterior returned is the
    normal one at the converged ridges (a variational approximation: it ignores the ``w``'s own uncertainty)."""
    if not model.components or model.design is None:
        return model
    components = []
    for c in model.components:
        ridge = model.ridge(c.log_lam)  # (S,): lambda, 0 for the fixed baseline (it has no prior to reshape)
        tau2 = c.s2 / math.exp(c.log_lam)
        sol = c.sol
        for _ in range(passes):
            second = sol.m**2 + c.s2 * (1 / sol.d + np.einsum("si,ij,sj->s", sol.r, sol.inverse, sol.r))  # (S,)
            sol = solve(model.design, ridge * (nu + 1) / (nu + second / tau2))
        components.append(Component(c.log_lam, c.weight, c.s2, sol))
    m = np.sum([c.weight * c.sol.m for c in components], axis=0)  # (S,)
    return Fit(model.keys, m, model.prior, tuple(components), model.df, model.design, model.fixed)
