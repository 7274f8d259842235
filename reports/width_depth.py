"""The Hourglass paper's width-depth curve: validation loss against ``d_model / L`` at a matched budget.

The paper finds the curve U-shaped with its optimum between ``d_model / L`` = 100 and 250. Near
an optimum the natural local form is a quadratic in ``x = log(d_model / L)``::

    loss(x) ~ a + b x + c x^2,      minimum at x* = -b / (2 c)   (a U-shape when c > 0)

fitted by weighted least squares, each shape one point (its mean over seeds) weighted by
``1 / se^2``, ``se`` its standard error (a single seed takes the pooled seed sd). The minimum's
95 % interval is a percentile bootstrap: every resample redraws each shape's seeds with
replacement (a single-seed shape redraws its mean from the pooled sd) and refits; resamples
without a minimum (``c <= 0``) count as misses and are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean, stdev

import numpy as np

PAPER_BAND = (100.0, 250.0)  # the Hourglass paper's optimal d_model / L at GPT scales


@dataclass(frozen=True)
class WidthDepthPoint:
    """One trained shape on the curve: its ``d_model / L`` and its seeds' losses."""

    label: str
    ratio: float
    losses: tuple[float, ...]

    @property
    def mean(self) -> float:
        return fmean(self.losses)


MAX_MISSES = 0.5  # resamples without a minimum from this share on: the curve's U is not what the data say


@dataclass(frozen=True)
class QuadraticFit:
    """``loss = a + b x + c x^2`` in ``x = log(d_model / L)``; the minimum and its bootstrap interval."""

    a: float
    b: float
    c: float
    n_points: int
    minimum: float | None  # d_model / L at the minimum; None when the fit is not U-shaped (c <= 0)
    low: float | None  # 95 % bootstrap interval of the minimum
    high: float | None
    bootstrap_misses: float  # share of resamples without a minimum
    x_range: tuple[float, float]  # the d_model / L range of the points

    def predict(self, ratio: np.ndarray) -> np.ndarray:
        x = np.log(ratio)
        return self.a + self.b * x + self.c * x ** 2

    @property
    def bounded(self) -> bool:
        """Whether the bootstrap bounds the minimum: most resamples have one (``MAX_MISSES``), and the interval of
        theirs holds the fitted minimum (half the resamples without one left 6.56e+03 outside [0.0859, 4.36e+03])."""
        return (self.low is not None and self.high is not None and self.minimum is not None
                and self.bootstrap_misses < MAX_MISSES and self.low <= self.minimum <= self.high)

    @property
    def resolved(self) -> bool:
        """An optimum this study can state: its minimum inside the trained range, with a bounded interval."""
        return self.minimum_inside and self.bounded

    @property
    def minimum_inside(self) -> bool:
        """The minimum lies within the range of trained shapes (otherwise it is an extrapolation)."""
        return self.minimum is not None and self.x_range[0] <= self.minimum <= self.x_range[1]


def _solve(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares for ``y = a + b x + c x^2``."""
    design = np.stack([np.ones_like(x), x, x ** 2], axis=1) * np.sqrt(w)[:, None]
    (a, b, c), *_ = np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)
    return float(a), float(b), float(c)


def _minimum(b: float, c: float) -> float | None:
    """``exp(-b / 2c)``; None when the curve is not U-shaped or its minimum lies beyond any sane width ratio."""
    if c <= 0:
        return None
    x = -b / (2 * c)
    return math.exp(x) if abs(x) < 50 else None


def pooled_seed_sd(points: list[WidthDepthPoint]) -> float | None:
    """The seed-to-seed sd of one shape's loss, pooled over the points with two or more seeds."""
    sum_squares = sum((len(p.losses) - 1) * stdev(p.losses) ** 2 for p in points if len(p.losses) >= 2)
    df = sum(len(p.losses) - 1 for p in points if len(p.losses) >= 2)
    return math.sqrt(sum_squares / df) if df else None


def fit_width_depth(points: list[WidthDepthPoint], resamples: int = 1000, seed: int = 0) -> QuadraticFit | None:
    """The weighted quadratic fit and its bootstrap (see the module docstring); None with fewer than 3 ratios."""
    if len({p.ratio for p in points}) < 3:
        return None
    sd = pooled_seed_sd(points) or 1.0  # without replicates every point weighs the same
    x = np.log(np.array([p.ratio for p in points]))
    means = np.array([p.mean for p in points])
    se = np.array([(stdev(p.losses) if len(p.losses) >= 3 else sd) / math.sqrt(len(p.losses)) for p in points])
    w = 1.0 / np.maximum(se, 1e-12) ** 2
    a, b, c = _solve(x, means, w)
    rng = np.random.default_rng(seed)
    minima, misses = [], 0
    for _ in range(resamples):
        drawn = np.array([rng.choice(p.losses, size=len(p.losses)).mean() if len(p.losses) >= 2
                          else p.losses[0] + rng.normal(0.0, sd) for p in points])
        m = _minimum(*_solve(x, drawn, w)[1:])
        if m is None:
            misses += 1
        else:
            minima.append(m)
    low = high = None
    if minima:
        low, high = (float(v) for v in np.percentile(minima, [2.5, 97.5]))
    ratios = [p.ratio for p in points]
    return QuadraticFit(a, b, c, len(points), _minimum(b, c), low, high, misses / resamples,
                        (min(ratios), max(ratios)))
