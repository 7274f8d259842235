"""What a study could have seen: the minimum detectable gain over the baseline, and the seeds a smaller one needs.

"No shape beats the baseline" means little without its resolution. A shape is declared better
when the lower end of its two-sided ``1 - alpha`` paired interval lies above zero
(``reports.summary``): a one-sided t-test at ``alpha / 2`` on ``n`` paired seeds, ``df = n - 1``.
With a true paired gain ``delta`` and a paired-difference sd ``sigma``, the statistic
``t = mean(d) / (s / sqrt(n))`` follows a noncentral t distribution with ``df`` degrees of freedom
and noncentrality ``delta sqrt(n) / sigma``, so the test's power is exactly::

    power(delta) = P(T'(df, delta sqrt(n) / sigma) > t_{1 - alpha/2, df})

The **minimum detectable gain** (MDG) is the ``delta`` at which that power is 80 % (Cohen 1988;
for large ``n`` it tends to ``(z_{1-alpha/2} + z_{0.8}) sigma / sqrt(n)``). The study supplies
``sigma`` (its pooled paired sd against the baseline, ``nas.stats.comparisons.pooled_paired_sd``),
``n`` (the leader's paired seeds that did not select it, as its interval uses them) and
``alpha`` (Bonferroni over the race's candidates after a race, over the replicated shapes after
fixed replicates, as the pick's interval). The seeds a 1 % and a 0.5 % gain would need are the
smallest ``n`` whose MDG is at most that share of the baseline's loss. ``tests/test_resolution.py``
checks the power against a simulation.

After adaptive replicates the sentence's test is the pick's 95 % *credible* interval of its shrunk
gain (``nas.stats.shrinkage``), not a t interval on its paired seeds (the shape model reads every
seed of every shape, so the baseline needs no seed in common with the pick). Its estimate is linear in
the scores at the REML ``lambda``, ``theta_hat ~ N(-g delta, s2 c2)`` at a true gain ``delta`` (every
other shape level with the baseline; ``GainDesign``), with posterior sd ``sqrt(s2 q)``,
so its power and minimum detectable gain are::

    power(delta) = Phi((g delta - z_{1-alpha/2} sqrt(s2 q)) / sqrt(s2 c2))
    MDG = (z_{1-alpha/2} rho sqrt(s2 q) + z_{0.8} sqrt(s2 c2)) / g

(``posterior_resolution``; ``g < 1``: the shrinkage keeps part of a true gain, so the MDG is larger than
``2.8`` posterior sds; ``rho >= 1``: the answer's interval is robust to the prior's tails, the union of the
normal prior's and a heavy-tailed one's (``nas.stats.board._gains_of``), and its decisive end lies ``rho``
times the normal prior's half-width from the estimate, ``ShrunkGain.widening`` of the leader).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import nctdtr, ndtr, ndtri, stdtrit  # scipy.stats' t, noncentral t and normal, without its import

from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import Fit, credible_quantile, fit

POWER = 0.8
TARGET_SHARES = (0.01, 0.005)  # the gains (as shares of the baseline's loss) whose seed counts every answer gives
MAX_SEEDS = 100_000


def power(delta: float, sd: float, n: int, alpha: float, df: int | None = None) -> float:
    """P(the lower end of the two-sided ``1 - alpha`` paired t interval is above 0) at a true gain ``delta``."""
    df = n - 1 if df is None else df
    critical, noncentrality = float(stdtrit(df, 1 - alpha / 2)), delta * math.sqrt(n) / sd
    sf = 1 - float(nctdtr(df, noncentrality, critical))  # the noncentral t's survival function
    if math.isfinite(sf):
        return sf
    from scipy import stats  # cdflib's nctdtr fails (NaN) far out (df 1563, noncentrality 40); Boost's does not

    return float(stats.nct.sf(critical, df, noncentrality))


def detectable_gain(sd: float, n: int, alpha: float, df: int | None = None, target: float = POWER) -> float:
    """The true paired gain (nats) that the test detects with probability ``target`` (the module docstring)."""
    from scipy.optimize import brentq  # here: only a race's or fixed replicates' answer needs it

    if sd <= 0:
        return 0.0
    high = sd
    while power(high, sd, n, alpha, df) < target:
        high *= 2
    return float(brentq(lambda delta: power(delta, sd, n, alpha, df) - target, 0.0, high, xtol=1e-10))


def seeds_needed(gain: float, sd: float, alpha: float) -> int | None:
    """The fewest paired seeds (``df = n - 1``) whose minimum detectable gain is at most ``gain``; None past
    ``MAX_SEEDS``."""
    if sd <= 0:
        return 2
    if detectable_gain(sd, MAX_SEEDS, alpha) > gain:
        return None
    low, high = 2, MAX_SEEDS  # detectable_gain falls with n: bisect for the first n at or below ``gain``
    while low < high:
        middle = (low + high) // 2
        if detectable_gain(sd, middle, alpha) <= gain:
            high = middle
        else:
            low = middle + 1
    return low


@dataclass(frozen=True)
class Resolution:
    """The minimum detectable gain of a study as it stands, and the seeds a 1 % and a 0.5 % gain need."""

    n: int  # the leader's paired seeds that count towards its gain
    sd: float  # the study's paired-difference sd against the baseline (nats)
    df: int
    alpha: float  # two-sided level of the pick's interval
    baseline_loss: float
    gain: float  # nats
    seeds_needed: dict[float, int | None]  # share of the baseline's loss -> paired seeds per shape
    baseline_n: int | None = None  # set for the credible interval's resolution: the baseline's seeds

    @property
    def gain_pct(self) -> float:
        return 100 * self.gain / self.baseline_loss

    def text(self) -> str:
        """``a gain of 6.17 % (0.188 nats) or more (80 % power, 8 paired seeds, paired sd 0.108)``; after adaptive
        replicates ``... (80 % power of its 95 % credible interval, 28 seeds of the leader, 2 of the baseline,
        paired sd 0.108)``."""
        return f"{self.gain_text()} ({self.power_text()})"

    def short_text(self) -> str:
        """``a gain of 6.17 % (0.188 nats) or more (80 % power)``: what the answer's first sentence says."""
        return f"{self.gain_text()} ({100 * POWER:.0f} % power)"

    def gain_text(self) -> str:
        return f"a gain of {self.gain_pct:.2f} % ({self.gain:.3f} nats) or more"

    def power_text(self) -> str:
        """``80 % power of its 95 % credible interval, 28 seeds of the leader, 2 of the baseline, paired sd 0.108``
        after adaptive replicates, else ``80 % power, 8 paired seeds, paired sd 0.108``."""
        head = f"{100 * POWER:.0f} % power"
        if self.baseline_n is not None:
            return (f"{head} of its {100 * (1 - self.alpha):.0f} % credible interval, {_count(self.n, 'seed')} of "
                    f"the leader, {self.baseline_n} of the baseline, paired sd {self.sd:.3f}")
        return f"{head}, {_count(self.n, 'paired seed')}, paired sd {self.sd:.3f}"

    def needs_text(self) -> str:
        """``a 1 % gain needs 166 paired seeds per shape, a 0.5 % gain 650``."""
        (first, n_first), *rest = self.seeds_needed.items()
        more = "".join(f", a {100 * share:g} % gain {_seeds(n)}" for share, n in rest)
        return f"a {100 * first:g} % gain needs {_seeds(n_first)} per shape{more}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _seeds(n: int | None) -> str:
    return f"more than {MAX_SEEDS:,} paired seeds" if n is None else f"{n} paired seeds"


def resolution(sd: float | None, pooled_df: int, n: int, alpha: float, baseline_loss: float) -> Resolution | None:
    """The ``Resolution`` for a leader with ``n`` paired seeds; None without an sd (no shape has two common seeds
    with the baseline yet) or with fewer than two paired seeds (the answer gives no interval on one)."""
    if sd is None or n < 2 or pooled_df < 1 or baseline_loss <= 0:
        return None
    df = n - 1
    return Resolution(n, sd, df, alpha, baseline_loss, detectable_gain(sd, n, alpha, df),
                      {share: seeds_needed(share * baseline_loss, sd, alpha) for share in TARGET_SHARES})


@dataclass(frozen=True)
class GainDesign:
    """How the plug-in posterior estimates one shape's gain over the baseline, ``theta = m_key - m_base``.

    At a fixed ``lambda`` the posterior mean is linear in the scores, ``theta_hat = c'y`` with ``c = W C^-1 e``
    (``W = [Z X]``, ``C`` the mixed-model equations' matrix, ``e`` = +1 at the shape, -1 at the baseline, 0 on the
    seeds). With ``v = C^-1 e`` (its shape block: ``Cov(m) e / s2``) and ``W'W = C - diag(Lambda, 0)`` (``Lambda``:
    ``lambda`` a shape, 0 for the baseline, a fixed effect; ``lambda ||v||^2`` below sums ``Lambda_s v_s^2``)::

        Var(theta | data) = s2 q,          q = v_key - v_base
        E[theta_hat] = -g delta,           g = 1 - lambda v_key   (a true gain delta, every other shape level with
                                                                   the baseline: the share the shrinkage keeps)
        Var(theta_hat) = s2 c2,            c2 = ||c||^2 = q - lambda ||v||^2

    ``nas.stats.resolution.posterior_resolution`` turns them into the gain its credible interval detects."""

    s2: float
    lam: float
    q: float
    g: float
    c2: float
    df: int = 0  # residual degrees of freedom of s2: the interval's quantile is Student t's (0: the normal one)
    widening: float = 1.0  # the answer's interval's deciding half-width over the normal prior's (ShrunkGain)

    def decisive_half_width(self, alpha: float) -> float:
        """``z_{1-alpha/2} rho sqrt(s2 q)``: how far the interval's deciding end lies from the estimate (nats)."""
        return credible_quantile(self.df, alpha) * self.widening * math.sqrt(self.s2 * self.q)

    @property
    def estimate_sd(self) -> float:
        """``sqrt(s2 c2)``: the estimate's own sd over the runs' noise (nats)."""
        return math.sqrt(self.s2 * self.c2)


def gain_design(scores: dict[str, ShapeScores], key: str, baseline_key: str,
                model: Fit | None = None) -> GainDesign | None:
    """``key``'s ``GainDesign`` at the REML estimate (``fit(plug_in=True)``, or ``model`` when given); None while
    nothing is shrunk."""
    model = model if model is not None else fit(scores, plug_in=True, baseline=baseline_key)
    if model is None or not model.components or key not in scores or baseline_key not in scores:
        return None
    c = max(model.components, key=lambda c: c.weight)
    k, b = model.keys.index(key), model.keys.index(baseline_key)
    e = np.zeros(len(model.keys))
    e[k], e[b] = 1.0, -1.0
    v = e / c.sol.d + c.sol.r @ (c.sol.inverse @ (c.sol.r.T @ e))  # (S,): Cov(m) e / s2
    ridge = model.ridge(c.log_lam)  # (S,): lambda, 0 for a fixed baseline
    lam = math.exp(c.log_lam)
    q = float(v[k] - v[b])
    return GainDesign(c.s2, lam, q, float(1 - ridge[k] * v[k]), max(0.0, q - float(v @ (ridge * v))), model.df)


def posterior_resolution(design: GainDesign | None, n: int, baseline_n: int, alpha: float,
                         baseline_loss: float) -> Resolution | None:
    """The ``Resolution`` of a shrunk gain's credible interval (module docstring) for a leader with ``n`` seeds and a
    baseline with ``baseline_n``; the seeds a 1 % and a 0.5 % gain need are a paired t-test's at the model's paired
    sd ``sqrt(2 s2)``. None without a design or when the shrinkage keeps nothing of a gain."""
    if design is None or design.g <= 0 or baseline_loss <= 0:
        return None
    # the interval's own quantile (nas.stats.shrinkage.Fit.quantile) in its decisive half-width
    gain = (design.decisive_half_width(alpha) + ndtri(POWER) * design.estimate_sd) / design.g
    sd = math.sqrt(2 * design.s2)
    return Resolution(n, sd, 0, alpha, baseline_loss, float(gain),
                      {share: seeds_needed(share * baseline_loss, sd, alpha) for share in TARGET_SHARES}, baseline_n)


def posterior_power(design: GainDesign, delta: float, alpha: float) -> float:
    """The probability that the shrunk gain's credible interval (``design``'s, at ``alpha``) lies wholly on the better
    side of zero for a shape truly ``delta`` nats better than the baseline (module docstring)::

        power(delta) = Phi((g delta - z rho sqrt(s2 q)) / sqrt(s2 c2))

    ``posterior_resolution``'s gain is where it reaches ``POWER``."""
    margin = design.g * delta - design.decisive_half_width(alpha)
    if design.estimate_sd <= 0:
        return float(margin > 0)
    return float(ndtr(margin / design.estimate_sd))


def allocation_limit(sd: float | None, replicate_trials: int, alpha: float, baseline_loss: float) -> Resolution | None:
    """The yardstick of an allocation: the minimum detectable gain of an oracle that knew the pick before the replicates
    and split the study's ``replicate_trials`` evenly between it and the baseline on common seeds (with the first
    pass's common seed, ``n = 1 + replicate_trials // 2`` paired seeds), tested by the paired t interval at ``alpha``
    with the study's own paired sd. At the default proxy's paired sd (0.108 nats) and 71 replicate trials it is
    about 1.7 % of the baseline's loss. None without an sd or a replicate."""
    if sd is None or sd <= 0 or replicate_trials < 2 or baseline_loss <= 0:
        return None
    n = 1 + replicate_trials // 2
    return resolution(sd, n - 1, n, alpha, baseline_loss)
