"""Design rules read across all of a study's runs: the shape model of ``nas.stats.shrinkage`` with fixed effects added.

A study too noisy to rank single shapes can still say what a *kind* of change does, by reading every run at once
(the design-space analyses of Radosavovic et al., ICCV 2019, and RegNet, CVPR 2020, did it by hand). Each rule is a
named covariate of a shape (``search_spaces.base.Rule``), and every score of the study is::

    L_s,i = u_i + x_s' beta + m_s + e_s,i      u_i: seed i's effect (fixed: shared by every shape on seed i)
                                               beta: the rules' effects (nats per unit of each covariate)
                                               m_s ~ N(0, tau^2): shape s's deviation from what its rules predict
                                               e_s,i ~ N(0, s2): the run's own luck

A rule is judged across *shapes*, not runs: ten seeds of one shape say nothing about a rule that only that shape
varies, which the shape deviation ``m_s`` carries. With ``X`` the fixed effects (seed indicators and covariates),
``Z`` the shapes and ``lambda = s2 / tau^2``, generalised least squares (Henderson's equations with the shape levels
eliminated; ``Z'Z`` is diagonal, so ``H^-1 = I - Z D^-1 Z'``, ``D = Z'Z + lambda``) gives::

    beta_hat = (X' H^-1 X)^-1 X' H^-1 y,      Var(beta_hat) = s2 (X' H^-1 X)^-1,      H = I + Z Z' / lambda

and ``lambda`` its restricted likelihood (REML, Patterson and Thompson 1971; ``s2`` profiled)::

    -2 l_R(lam) = (n - p) log(q / (n - p)) + sum_s log(1 + n_s / lam) + log |X' H^-1 X|
    q = y' H^-1 y - beta' X' H^-1 y

the same likelihood ``nas.stats.mixed_model`` evaluates with the seeds alone as fixed effects. The estimate is the GLS
at the REML ``lambda`` (what statsmodels' ``MixedLM`` gives; ``tests/test_rules.py`` holds them within 1e-4 nats).
Its interval carries the uncertainty of ``lambda``, as the shape answer's does: the variance is averaged over the
posterior of ``lambda`` on ``nas.stats.shrinkage.LOG_LAMBDA_GRID`` (REML likelihood times a flat prior on ``tau``,
Gelman 2006), around the estimate, ``sum_j w_j (s2_j (X' H_j^-1 X)^-1 + (beta_j - beta_hat)^2)``. So the shape
variance at its boundary (``tau = 0``, where REML puts it on the default search, and where a plug-in standard error
is either too short or, in statsmodels, nan) still gives a finite interval that knows ``tau`` could be larger. The
interval's quantile is Student t with the *containment* degrees of freedom of a shape-level effect (SAS PROC MIXED's
``DDFM=CONTAIN``): the shapes less the rank of the rules and the intercept, ``df = S - 1 - R``.

Per rule, with ``sd`` that averaged standard error:

- the 95 % interval ``beta_hat +- t_{0.975, df} sd``, and the same in % of the baseline's mean loss;
- the minimum detectable effect at 80 % power, ``(t_{0.975, df} + t_{0.8, df}) sd`` (the normal-theory MDE of a
  two-sided 5 % test; Cohen 1988);
- a verdict: **resolved** (the interval excludes 0), **not resolved**, **confounded** (the study never varied it
  apart from another rule, or from the seeds: its column is a combination of the others, ``1 - R^2 < CONFOUNDED``;
  no number is given) or **not varied** (the same value in every shape).

A rule and its square (``Rule.square_of``: the width-depth U) have an optimum ``x* = -b_1 / (2 b_2)``, whose
interval is Fieller's (1954), the exact set of ``x`` with ``|b_1 + 2 b_2 x| <= t sd(b_1 + 2 b_2 x)``.

At a longer budget (``nas rules --confirm``) the same model is fitted to the re-runs and each rule's two estimates
compared (``nas.stats.rule_checks.fidelity``): **held**, **shrank**, **reversed** or **not resolved**.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.special import stdtrit

from nas.stats.comparisons import ALPHA
from nas.stats.resolution import POWER
from nas.stats.rule_reml import design_of, reml_estimate
from nas.stats.scores import ShapeScores, mean_by_seed

CONFOUNDED = 1e-3  # 1 - R^2 of a rule's column on the other fixed effects below this: it was never varied apart
MIN_SHAPES = 3  # a rule needs shapes to vary across, and the model a spread to estimate
MIN_SHAPE_DF = 4  # S - 1 - R below this: the flat prior on tau leaves the interval to the grid's end (no number)
MAX_SHARE = 0.5  # one shape's share of a rule's spread over the shapes above this: it is most of what varies it

RESOLVED, NOT_RESOLVED, CONFOUNDED_VERDICT, NOT_VARIED = "resolved", "not resolved", "confounded", "not varied"
TOO_FEW_SHAPES = "too few shapes"
CARRIED = "carried by one shape"  # resolved with every shape, not without the one at an end of the rule's range
SEED_EFFECTS = "the seed effects"  # what a rule constant within each seed is confounded with


@dataclass(frozen=True)
class RuleEstimate:
    """One rule's effect in a study (nats per unit of its covariate); numbers are None when it is confounded or was
    not varied."""

    name: str
    verdict: str  # resolved | not resolved | confounded | not varied | too few shapes
    estimate: float | None = None
    sd: float | None = None  # the standard error, averaged over lambda's posterior (module docstring)
    low: float | None = None  # 95 % interval
    high: float | None = None
    mdg: float | None = None  # minimum detectable effect at 80 % power (nats per unit)
    df: int = 0
    baseline_loss: float | None = None
    confounded_with: str | None = None  # the rule (or "the seed effects") it was never varied apart from
    at: float | None = None  # a rule fitted with its square: the covariate value its slope is read at (the mean)
    proxy_at: bool = False  # ``at`` is another study's (the proxy's, for a longer budget), not this one's mean
    carried_by: str | None = None  # ``CARRIED``: the shape without which the rule is not resolved

    @property
    def estimated(self) -> bool:
        return self.estimate is not None

    def percent(self, value: float | None) -> float | None:
        """``value`` (nats) in % of the baseline's mean loss."""
        return None if value is None or not self.baseline_loss else 100 * value / self.baseline_loss


@dataclass(frozen=True)
class Optimum:
    """The bottom of a U (a rule and its square): ``x* = -b_1 / (2 b_2)`` with Fieller's 95 % interval; ``low`` and
    ``high`` None when the interval is unbounded (the curvature is not resolved)."""

    linear: str
    square: str
    x: float | None  # None when the fitted curve opens downwards (no minimum)
    low: float | None
    high: float | None
    lowest: float = -math.inf  # the range of the rule's values the study trained: a bottom outside it is an
    highest: float = math.inf  # extrapolation, not a finding

    @property
    def inside(self) -> bool:
        """Whether the bottom lies within the trained range."""
        return self.x is not None and self.lowest <= self.x <= self.highest


@dataclass(frozen=True)
class RuleFit:
    """The rule model fitted to one study's runs (module docstring)."""

    names: tuple[str, ...]  # the rules asked for, in order
    estimates: tuple[RuleEstimate, ...]  # one per name
    runs: int
    shapes: int
    seeds: int
    tau: float  # the REML estimate of the shapes' deviation sd beyond their rules (0: at its boundary)
    sigma: float  # the REML estimate of one run's own sd
    df: int
    baseline_loss: float | None
    fitted: tuple[str, ...] = ()  # the rules in the model (neither confounded nor constant)
    beta: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)  # (R_fit,) at the REML lambda
    covariance: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)  # (R_fit, R_fit)
    covariates: dict[str, tuple[float, ...]] = field(default_factory=dict, repr=False)  # shape -> its rules' values
    adjusted: dict[str, float] = field(default_factory=dict, repr=False)  # shape -> mean loss less its seeds' effects
    centres: dict[str, float] = field(default_factory=dict)  # a square rule -> the value its square is centred at
    pairs: dict[str, str] = field(default_factory=dict)  # a square rule -> its rule, for the pairs read as a U

    @property
    def shape_df(self) -> int:
        """The shapes' degrees of freedom besides the fitted rules and the intercept: ``S - 1 - R``."""
        return self.shapes - 1 - len(self.fitted)

    @property
    def spread_read(self) -> bool:
        """Whether ``tau`` is the data's: below ``MIN_SHAPE_DF`` the shapes' spread beyond the rules is the prior's
        (with none left, any value fits), as every rule's interval is."""
        return self.shape_df >= MIN_SHAPE_DF

    def design_value(self, key: str, name: str) -> float:
        """A shape's value of a rule as the model read it: a square rule's is ``(x - c)^2`` (``fit_rules``)."""
        row = self.covariates[key]
        if name not in self.pairs:
            return row[self.names.index(name)]
        return (row[self.names.index(self.pairs[name])] - self.centres[name]) ** 2

    def curve(self, name: str, xs: np.ndarray) -> np.ndarray:
        """A fitted rule's contribution at its values ``xs`` (its square's with it, for a U), up to a constant."""
        i = self.fitted.index(name)
        ys = float(self.beta[i]) * xs
        for square, linear in self.pairs.items():
            if linear == name:
                ys = ys + float(self.beta[self.fitted.index(square)]) * (xs - self.centres[square]) ** 2
        return ys

    def estimate(self, name: str) -> RuleEstimate:
        return self.estimates[self.names.index(name)]

    @property
    def resolved(self) -> tuple[RuleEstimate, ...]:
        return tuple(e for e in self.estimates if e.verdict == RESOLVED)

    def partial_residuals(self, name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Every shape's ``(x_s, r_s)`` for one fitted rule, and the shapes: ``r_s`` is its mean loss less its seeds'
        effects and the other rules' fitted contributions, so that ``r_s`` against ``x_s`` shows the rule's line
        ``beta x`` (up to a constant) with the scatter the shapes leave around it."""
        own = {name} | {sq for sq, lin in self.pairs.items() if lin == name}  # a U's rule carries its square
        keys = [key for key in self.adjusted if key in self.covariates]
        others = np.array([sum(float(self.beta[i]) * self.design_value(k, n) for i, n in enumerate(self.fitted)
                               if n not in own) for k in keys])  # (S,)
        x = np.array([self.covariates[k][self.names.index(name)] for k in keys])  # (S,)
        return x, np.array([self.adjusted[k] for k in keys]) - others, keys

    def optimum(self, linear: str, square: str) -> Optimum | None:
        """The U's bottom in the linear rule's units (module docstring); None unless both rules were fitted as a U.
        With the square centred at ``c``, the slope at ``x`` is ``b1 + 2 b2 u``, ``u = x - c``."""
        if linear not in self.fitted or square not in self.fitted or self.pairs.get(square) != linear:
            return None
        if any(e.verdict == TOO_FEW_SHAPES for e in self.estimates):
            return None
        i, j = self.fitted.index(linear), self.fitted.index(square)
        b1, b2, centre = float(self.beta[i]), float(self.beta[j]), self.centres[square]
        v11, v12, v22 = self.covariance[i, i], self.covariance[i, j], self.covariance[j, j]
        values = [row[self.names.index(linear)] for row in self.covariates.values()]
        lowest, highest = min(values), max(values)
        t = quantile(self.df)
        # (b1 + 2 b2 u)^2 <= t^2 (v11 + 4 u v12 + 4 u^2 v22)  <=>  a u^2 + b u + c <= 0
        a, b, c = 4 * (b2**2 - t**2 * v22), 4 * (b1 * b2 - t**2 * v12), b1**2 - t**2 * v11
        x = centre - b1 / (2 * b2) if b2 > 0 else None
        if a <= 0 or x is None:
            return Optimum(linear, square, x, None, None, lowest, highest)
        root = math.sqrt(max(b * b - 4 * a * c, 0.0))
        return Optimum(linear, square, x, centre + (-b - root) / (2 * a), centre + (-b + root) / (2 * a), lowest,
                       highest)


def quantile(df: int, alpha: float = ALPHA) -> float:
    """``t_{1 - alpha/2, df}``."""
    return float(stdtrit(max(df, 1), 1 - alpha / 2))


def _unexplained(column: np.ndarray, others: np.ndarray) -> float:
    """``1 - R^2`` of ``column`` regressed on ``others`` (no intercept added), 0 for a column the others span."""
    total = float(column @ column)
    if total <= 0:
        return 0.0
    coef = np.linalg.lstsq(others, column, rcond=None)[0]
    resid = column - others @ coef
    return float(resid @ resid) / total


def _confounding(seeds: np.ndarray, x: np.ndarray, names: Sequence[str]) -> dict[str, str]:
    """For each rule the study never varied apart from the other fixed effects, which: the other rule that carries
    most of it (largest standardised coefficient), or "the seed effects" when the seeds alone span it."""
    out: dict[str, str] = {}
    for j, name in enumerate(names):
        column = x[:, j] - seeds @ np.linalg.lstsq(seeds, x[:, j], rcond=None)[0]  # within seeds
        if float(column @ column) <= 1e-12 * max(1.0, float(x[:, j] @ x[:, j])):
            out[name] = SEED_EFFECTS
            continue
        others = [k for k in range(len(names)) if k != j]
        if not others:
            continue
        rest = x[:, others] - seeds @ np.linalg.lstsq(seeds, x[:, others], rcond=None)[0]  # (n, R-1)
        if _unexplained(column, rest) < CONFOUNDED:
            coef = np.linalg.lstsq(rest, column, rcond=None)[0]
            scale = coef * np.sqrt(np.sum(rest**2, axis=0))
            out[name] = names[others[int(np.argmax(np.abs(scale)))]]
    return out


def fit_rules(scores: Mapping[str, ShapeScores], covariates: Mapping[str, Sequence[float]], names: Sequence[str],
              baseline_loss: float | None = None, squares: Mapping[str, str] | None = None,
              at: Mapping[str, float] | None = None, influence: bool = True) -> RuleFit | None:
    """The rule model (module docstring) on every shape of ``scores`` with ``covariates`` (shape key -> one value a
    rule of ``names``); a seed trained twice counts with its mean, as in the shape model. None with fewer than
    ``MIN_SHAPES`` shapes or too few runs for the seeds and rules.

    ``squares`` (square's name -> its rule's): a rule fitted with its square is a U. Its square enters centred,
    ``(x - c)^2``, at the shapes' mean ``c`` (or ``at[rule]`` when given: a longer budget's fit reads it where the
    proxy's did), so that the rule's own coefficient is the slope at ``c`` (``RuleEstimate.at``): uncentred, it is the
    slope at ``x = 0`` (at ``d_model / L = 1`` for the width-depth U), an extrapolation no study measures, and ``x``
    and ``x^2`` over a narrow range are nearly collinear. The curvature and the fit are the same either way.

    ``influence``: a resolved rule is fitted again without the shape at each end of its range (the two with the most
    leverage on its slope); where either refit no longer resolves it with the same sign, or no longer varies it, its
    verdict is ``CARRIED`` (``carried_by`` names the shape): eight shapes at ``d_h / d_model`` 0.3-1.0 and the
    baseline alone at 2.75 "resolved" a slope that was the baseline's one run against the rest."""
    names = tuple(names)
    keys = [k for k in scores if k in covariates and scores[k].n]
    rows = [(s, seed, loss) for s, k in enumerate(keys) for seed, loss in mean_by_seed(scores[k]).items()]
    if len(keys) < MIN_SHAPES or not rows:
        return None
    seed_list = sorted({seed for _, seed, _ in rows})
    seed_index = {seed: i for i, seed in enumerate(seed_list)}
    shape = np.array([s for s, _, _ in rows])  # (n,)
    y = np.array([loss for _, _, loss in rows])  # (n,)
    seeds = np.zeros((len(rows), len(seed_list)))  # (n, I)
    seeds[np.arange(len(rows)), [seed_index[seed] for _, seed, _ in rows]] = 1.0
    values = np.array([[float(v) for v in covariates[k]] for k in keys])  # (S, R)
    pairs = {square: linear for square, linear in (squares or {}).items() if square in names and linear in names}
    pairs_given = dict(pairs)
    centres = {}
    for square, linear in pairs.items():  # the square centred (docstring)
        j = names.index(linear)
        centres[square] = float(at[linear]) if at and linear in at else float(values[:, j].mean())
        values[:, names.index(square)] = (values[:, j] - centres[square]) ** 2
    x_all = values[shape]  # (n, R)
    varied = [j for j in range(len(names)) if np.ptp(values[:, j]) > 1e-12]
    confounded = _confounding(seeds, x_all[:, varied], [names[j] for j in varied])
    fitted = [j for j in varied if names[j] not in confounded]
    x = np.hstack([seeds, x_all[:, fitted]])  # (n, p)
    df_runs = len(y) - x.shape[1]
    if df_runs < 1:
        return None
    design = design_of(shape, x, y, len(keys))
    beta, covariance, tau, sigma, df, u = reml_estimate(design, len(fitted), len(keys), len(seed_list))
    covariance_of = {names[j]: i for i, j in enumerate(fitted)}
    q, power_q = quantile(df), float(stdtrit(max(df, 1), POWER))
    # too few shapes for the rules the study varied: with S <= R + 1 every column is a combination of the others,
    # which is no confounding, and the rules left in the model after dropping those would get a number
    few_for_all = len(keys) - 1 - len(varied) < MIN_SHAPE_DF
    too_few = few_for_all or len(keys) - 1 - len(fitted) < MIN_SHAPE_DF
    spare = len(keys) - 1 - (len(varied) if few_for_all else len(fitted))
    pairs = {square: linear for square, linear in pairs.items() if square in covariance_of and linear in covariance_of}
    out = []
    for j, name in enumerate(names):
        if j not in varied:
            out.append(RuleEstimate(name, NOT_VARIED, baseline_loss=baseline_loss))
        elif name in confounded and (confounded[name] == SEED_EFFECTS or not few_for_all):
            out.append(RuleEstimate(name, CONFOUNDED_VERDICT, baseline_loss=baseline_loss,
                                    confounded_with=confounded[name]))
        elif too_few:  # the interval would be the grid's, not the data's (MIN_SHAPE_DF)
            out.append(RuleEstimate(name, TOO_FEW_SHAPES, baseline_loss=baseline_loss, df=spare))
        else:
            i = covariance_of[name]
            value, sd = float(beta[i]), math.sqrt(max(float(covariance[i, i]), 0.0))
            low, high = value - q * sd, value + q * sd
            verdict = RESOLVED if low > 0 or high < 0 else NOT_RESOLVED
            square = next((sq for sq, lin in pairs.items() if lin == name), None)
            out.append(RuleEstimate(name, verdict, value, sd, low, high, (q + power_q) * sd, df, baseline_loss,
                                    at=centres[square] if square else None,
                                    proxy_at=bool(square and at and name in at)))
    if influence:  # the refits read a U's slope where this fit did: at this fit's centres, not their own means
        held_at = {**(at or {}), **{pairs_given[square]: centre for square, centre in centres.items()}}
        out = [_influence_checked(e, scores, covariates, names, baseline_loss, squares, held_at, keys,
                                  values[:, names.index(e.name)]) if e.verdict == RESOLVED else e for e in out]
    seed_effect = u[[seed_index[seed] for _, seed, _ in rows]]  # (n,)
    adjusted = {keys[s]: float(np.mean((y - seed_effect)[shape == s])) for s in range(len(keys))}
    return RuleFit(names, tuple(out), len(y), len(keys), len(seed_list), tau, sigma, df, baseline_loss,
                   tuple(names[j] for j in fitted), beta, covariance,
                   {k: tuple(float(v) for v in covariates[k]) for k in keys}, adjusted,
                   {sq: c for sq, c in centres.items() if sq in pairs}, pairs)


def _influence_checked(estimate: RuleEstimate, scores: Mapping[str, ShapeScores],
                       covariates: Mapping[str, Sequence[float]], names: tuple[str, ...], baseline_loss: float | None,
                       squares: Mapping[str, str] | None, at: Mapping[str, float] | None, keys: list[str],
                       column: np.ndarray) -> RuleEstimate:
    """``estimate`` (resolved), or it as ``CARRIED`` by the shape at an end of its range (``column``: the rule's value
    for each of ``keys``, a square's centred) that holds more than half the rule's spread over the shapes
    (``MAX_SHARE`` of ``sum (x - mean)^2``: ``(x_s - mean)^2 / sum (x - mean)^2``; evenly spaced values give an end
    0.36 at 6 shapes, a lone far shape nearly all of it), or without which a refit (its square centred where this fit
    centred it) does not resolve it with the same sign. A refit left with too few shapes to read any rule, or no fit,
    cannot tell, and the share decides alone."""
    spread = float(((column - column.mean()) ** 2).sum())
    ends = list(dict.fromkeys((int(np.argmin(column)), int(np.argmax(column)))))
    share = {end: (column[end] - column.mean()) ** 2 / spread for end in ends}  # of the rule's spread over shapes
    ends.sort(key=lambda end: -share[end])  # the shape with the largest share first: it is the one to name
    if share[ends[0]] > MAX_SHARE:
        return replace(estimate, verdict=CARRIED, carried_by=keys[ends[0]])
    for end in ends:
        left = keys[end]
        refit = fit_rules({k: v for k, v in scores.items() if k != left}, covariates, names, baseline_loss, squares,
                          at, influence=False)
        again = refit.estimate(estimate.name) if refit is not None else None
        if again is None or again.verdict == TOO_FEW_SHAPES:  # no fit left to tell: the share decided
            continue
        held = again is not None and again.verdict == RESOLVED and (again.estimate > 0) == (estimate.estimate > 0)
        if not held:
            return replace(estimate, verdict=CARRIED, carried_by=left)
    return estimate
