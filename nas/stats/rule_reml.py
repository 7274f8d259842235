"""REML for the rule model of ``nas.stats.rules`` (its module docstring has the model and the formulas): the sums
GLS needs once (``Design``), the restricted likelihood and GLS at any ``lambda = s2 / tau^2`` (``Design.at``), and
the estimate with its covariance averaged over ``lambda``'s posterior (``reml_estimate``; Patterson and Thompson 1971,
Gelman 2006 for the flat prior on ``tau``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nas.stats.mixed_model import golden_section
from nas.stats.shrinkage import LOG_LAMBDA_GRID, MIN_COMPONENT_WEIGHT

GOLDEN_STEPS = 48  # golden-section steps refining REML's log lambda: the bracket (1 wide) shrinks to 1e-10


@dataclass(frozen=True)
class Design:
    """The sums GLS and REML need, independent of ``lambda`` (the rule model's docstring): ``p`` fixed effects,
    ``S`` shapes."""

    counts: np.ndarray  # (S,) runs of each shape (Z'Z)
    zx: np.ndarray  # (S, p)
    xx: np.ndarray  # (p, p)
    zy: np.ndarray  # (S,)
    xy: np.ndarray  # (p,)
    yy: float
    n: int

    @property
    def p(self) -> int:
        return len(self.xy)

    def at(self, log_lam: float) -> tuple[float, float, np.ndarray, np.ndarray]:
        """``(REML deviance, profiled s2, beta, (X' H^-1 X)^-1)`` at ``log lambda`` (``inf``: ``tau = 0``, OLS)."""
        if math.isinf(log_lam):
            a, c, quad, logh = self.xx, self.xy, self.yy, 0.0
        else:
            lam = math.exp(log_lam)
            d = self.counts + lam  # (S,)
            a = self.xx - self.zx.T @ (self.zx / d[:, None])  # (p, p): X' H^-1 X
            c = self.xy - self.zx.T @ (self.zy / d)  # (p,): X' H^-1 y
            quad = self.yy - float(np.sum(self.zy**2 / d))  # y' H^-1 y
            logh = float(np.sum(np.log1p(self.counts / lam)))
        inverse = np.linalg.inv(a)
        beta = inverse @ c
        df = self.n - self.p
        q = max(quad - float(beta @ c), 1e-300)
        return df * math.log(q / df) + logh + float(np.linalg.slogdet(a)[1]), q / df, beta, inverse


def design_of(shape: np.ndarray, x: np.ndarray, y: np.ndarray, n_shapes: int) -> Design:
    """The sums of runs ``y`` (n,) on fixed effects ``x`` (n, p), run ``k`` of shape ``shape[k]``."""
    zx = np.zeros((n_shapes, x.shape[1]))
    np.add.at(zx, shape, x)
    return Design(np.bincount(shape, minlength=n_shapes).astype(float), zx, x.T @ x,
                   np.bincount(shape, weights=y, minlength=n_shapes), x.T @ y, float(y @ y), len(y))


def reml_estimate(design: Design, n_rules: int, n_shapes: int, n_seeds: int):
    """The REML estimate and the lambda-averaged covariance of the rules' effects (the rule model's docstring):
    ``(beta (R,), covariance (R, R), tau, sigma, df, seed effects (I,))``."""
    evaluated = [design.at(float(g)) for g in LOG_LAMBDA_GRID]
    deviances = np.array([e[0] for e in evaluated])
    no_spread = design.at(math.inf)
    i = int(np.argmin(deviances))
    if no_spread[0] <= deviances[i] + 1e-9:  # flattest at no spread: tau = 0, the fit is OLS with seed effects
        mode_log_lam, (_, s2, beta, _) = math.inf, no_spread
    else:
        low, high = LOG_LAMBDA_GRID[max(0, i - 1)], LOG_LAMBDA_GRID[min(len(LOG_LAMBDA_GRID) - 1, i + 1)]
        mode_log_lam = golden_section(lambda v: design.at(v)[0], float(low), float(high), GOLDEN_STEPS)
        _, s2, beta, _ = design.at(mode_log_lam)
    taus = np.sqrt([e[1] / math.exp(g) for g, e in zip(LOG_LAMBDA_GRID, evaluated)])  # (G,)
    weights = np.exp(-(deviances - deviances.min()) / 2) * taus  # flat in tau (as nas.stats.shrinkage.fit)
    weights /= weights.sum()
    rules = slice(design.p - n_rules, design.p)
    covariance = np.zeros((n_rules, n_rules))
    kept = weights > MIN_COMPONENT_WEIGHT
    for w, (_, s2_j, beta_j, inverse_j) in zip(weights[kept] / weights[kept].sum(),
                                               (e for e, k in zip(evaluated, kept) if k)):
        shift = beta_j[rules] - beta[rules]
        covariance += w * (s2_j * inverse_j[rules, rules] + np.outer(shift, shift))
    tau = 0.0 if math.isinf(mode_log_lam) else math.sqrt(s2 / math.exp(mode_log_lam))
    df = max(1, n_shapes - 1 - n_rules)
    return beta[rules], covariance, tau, math.sqrt(s2), df, beta[:n_seeds]
