"""The two-way mixed model behind the shrunk ranking (``nas.stats.shrinkage``): its sums, its solve, its likelihood.

Every score of a study is ``L_s,i = m_s + u_i + e_s,i`` (shape level, seed effect, run noise). Given ``lambda =
s2 / tau^2`` Henderson's mixed-model equations (``lambda I`` is one ridge a shape: 0 for a fixed level, the
baseline's, ``nas.stats.shrinkage``)::

    [Z'Z + lambda I   Z'X] [m]   [Z'y]
    [X'Z             X'X] [u] = [X'y]        posterior covariance s2 * (that matrix)^-1

are solved by eliminating whichever block is smaller (both ``Z'Z`` and ``X'X`` are diagonal): the shape
levels when shapes outnumber seeds (``solve``), the seed effects otherwise (``eliminate_seeds``).
``Likelihood`` is the REML deviance of ``lambda`` (Patterson and Thompson 1971) built on the same solve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


class Solution(NamedTuple):
    """One solve; the shape levels' posterior covariance is ``s2 (diag(1 / d) + r inverse r')`` in both forms."""

    m: np.ndarray  # (S,) shape levels
    u: np.ndarray  # (I,) seed effects
    d: np.ndarray  # (S,) Z'Z + lam (diagonal); inf when the seeds were eliminated instead
    r: np.ndarray  # (S, I) D^-1 Z'X (the last column dropped when lam = 0); (S, S) identity when seeds eliminated
    inverse: np.ndarray  # the Schur complement's inverse: (I, I) over the seeds, or (S, S) over the shapes
    logdet: float  # log |Schur complement| = log |X' H^-1 X|, H = I + Z Z' / lam (for the REML likelihood)
    quadratic: float  # y'y - m'Z'y - u'X'y: (n - p) s2 at this lam (Henderson)



class Design(NamedTuple):
    """The sums the mixed-model equations need, independent of ``lambda``: computed once a fit."""

    counts: np.ndarray  # (S,) seeds of each shape (Z'Z)
    zx: np.ndarray  # (S, I) runs of each shape at each seed
    zy: np.ndarray  # (S,)
    xy: np.ndarray  # (I,)
    xx: np.ndarray  # (I,)
    yy: float


def design_sums(shape: np.ndarray, seed: np.ndarray, y: np.ndarray, n_shapes: int, n_seeds: int) -> Design:
    zx = np.zeros((n_shapes, n_seeds))
    np.add.at(zx, (shape, seed), 1.0)
    return Design(np.bincount(shape, minlength=n_shapes).astype(float), zx,
                   np.bincount(shape, weights=y, minlength=n_shapes), np.bincount(seed, weights=y, minlength=n_seeds),
                   np.bincount(seed, minlength=n_seeds).astype(float), float(y @ y))


def solve(design: Design, lam: float | np.ndarray) -> Solution:
    """``m`` and ``u`` of the mixed-model equations (module docstring) with ridge ``lam`` on ``m`` (0: the
    fixed-effects fit, its last seed effect pinned to 0; an ``(S,)`` array: one ridge a shape, as the heavy-tailed
    prior's reweighting needs, ``nas.stats.shrinkage.heavy_tailed``), and what variances and the likelihood need:
    ``D`` (Z'Z + lam, diagonal), ``R = D^-1 Z'X``, the Schur complement's inverse and log-determinant."""
    counts, zx, zy, xy, xx, yy = design
    pinned = bool(np.all(np.asarray(lam) == 0))
    if not pinned and len(xx) > len(counts):
        return eliminate_seeds(design, lam)
    d = counts + lam  # (S,)
    r = zx / d[:, None]  # (S, I)
    schur = np.diag(xx) - zx.T @ r  # (I, I)
    rhs = xy - r.T @ zy  # (I,)
    if pinned:  # shape and seed effects are identified up to one shared constant: pin the last seed's
        schur, rhs = schur[:-1, :-1], rhs[:-1]
        inverse, logdet = np.linalg.pinv(schur), 0.0
    else:  # positive definite: every seed has a run and D_s > Z'Z
        inverse, logdet = np.linalg.inv(schur), float(np.linalg.slogdet(schur)[1])
    u = inverse @ rhs
    if pinned:
        u = np.append(u, 0.0)
        r = r[:, :-1]
    m = (zy - zx @ u) / d
    return Solution(m, u, d, r, inverse, logdet, float(yy - m @ zy - u @ xy))


def eliminate_seeds(design: Design, lam: float | np.ndarray) -> Solution:
    """``solve`` for a study with more seeds than shapes (a long race or confirm phase, a small space
    replicated for hours): the seed effects are eliminated instead, as ``X'X`` is diagonal too, so the work is
    ``O(S^3)`` instead of ``O(I^3)``::

        (D - Z'X (X'X)^-1 X'Z) m = Z'y - Z'X (X'X)^-1 X'y,      u = (X'X)^-1 (X'y - X'Z m)

    with the shape levels' posterior covariance ``s2`` times that ``(S, S)`` matrix's inverse, and the REML
    likelihood's ``log |X' H^-1 X|`` from the block determinant ``|D| |S_seeds| = |X'X| |S_shapes|``."""
    counts, zx, zy, xy, xx, yy = design
    d = counts + lam  # (S,)
    w = zx / xx[None, :]  # (S, I): Z'X (X'X)^-1
    schur = np.diag(d) - w @ zx.T  # (S, S)
    inverse = np.linalg.inv(schur)
    m = inverse @ (zy - w @ xy)  # (S,)
    u = (xy - zx.T @ m) / xx  # (I,)
    logdet = float(np.linalg.slogdet(schur)[1] + np.sum(np.log(xx)) - np.sum(np.log(d)))
    return Solution(m, u, np.full(len(d), np.inf), np.eye(len(d)), inverse, logdet, float(yy - m @ zy - u @ xy))


class Likelihood:
    """The REML deviance of ``lambda = s2 / tau^2`` for one study's scores (Patterson and Thompson 1971), the seed
    effects fixed::

        -2 l_R(lam) = (n - p) log(q(lam) / (n - p)) + sum_s log(1 + n_s / lam) + log |X' H^-1 X|,
        lam = s2 / tau^2,  s2 = q(lam) / (n - p),  H = I + Z Z' / lam,  p = the number of seeds,

    ``q`` the quadratic of Henderson's equations at ``lam`` (constants dropped). A likelihood, unlike the moment
    estimate from the fixed-effects fit, is not biased by the adaptive choice of which shapes get more seeds (a
    choice made on observed scores is ignorable for the likelihood); the moment estimate's ``s2`` is inflated by
    the selected seed of every shape that was replicated because it was lucky, and so it over-shrinks."""

    def __init__(self, shape: np.ndarray, seed: np.ndarray, y: np.ndarray, n_shapes: int, n_seeds: int,
                 fixed: int | None = None) -> None:
        self.design = design_sums(shape, seed, y, n_shapes, n_seeds)
        self.random = np.ones(n_shapes)  # (S,): 1 for a random shape level, 0 for the fixed one
        if fixed is not None:
            self.random[fixed] = 0.0
        self.df = len(y) - n_seeds - (fixed is not None)  # n - p

    def at(self, log_lam: float) -> tuple[float, float, Solution]:
        """``(deviance, profiled s2, the solve)`` at ``log lambda``; a ``fixed`` shape (the baseline) is a fixed
        effect: no ridge, no term in ``sum_s log(1 + n_s / lam)``, one more ``p`` (its column in ``X``, whose
        ``log |X' H^-1 X|`` differs from the seeds' Schur complement by the constant ``log n_fixed``)."""
        lam = math.exp(log_lam)
        sol = solve(self.design, lam * self.random)
        q = max(sol.quadratic, 1e-300)
        deviance = (self.df * math.log(q / self.df) + float(np.sum(self.random * np.log1p(self.design.counts / lam)))
                    + sol.logdet)
        return deviance, q / self.df, sol

    def mode(self, grid: np.ndarray, deviances: np.ndarray) -> float:
        """The REML estimate of ``log lambda``: the grid's best point refined by golden section; the grid's upper
        end when the likelihood is flattest there (no spread: ``tau^2 = 0``)."""
        i = int(np.argmin(deviances))
        low, high = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
        return golden_section(lambda x: self.at(x)[0], float(low), float(high), 12)


def golden_section(f: Callable[[float], float], low: float, high: float, iterations: int) -> float:
    """The minimum of a unimodal ``f`` on ``[low, high]`` by golden-section search (Kiefer 1953): each iteration
    keeps the 0.618 of the bracket that holds it; the bracket's midpoint after ``iterations``."""
    golden = (math.sqrt(5) - 1) / 2
    a, b = high - golden * (high - low), low + golden * (high - low)
    fa, fb = f(a), f(b)
    for _ in range(iterations):
        if fa < fb:
            high, b, fb = b, a, fa
            a = high - golden * (high - low)
            fa = f(a)
        else:
            low, a, fa = a, b, fb
            b = low + golden * (high - low)
            fb = f(b)
    return (low + high) / 2
