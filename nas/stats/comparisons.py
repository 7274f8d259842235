"""Paired comparisons of shapes on common seeds, the set tied with the best, and rank agreement (Kendall tau).

Shapes are compared on the seeds both trained (same data order at a seed; Prism members also
share their initial weights), which removes most of the seed-to-seed noise one shape's score
carries. For a shape ``c`` and a reference ``r`` on common seeds ``s``::

    d_s = L_r,s - L_c,s                     (positive: c is better)
    gain % = 100 mean(d) / mean(L_r,s)      CI: mean(d) +- t_{0.975, df} sd(d) / sqrt(n), in % of mean(L_r,s)

With one common seed ``sd(d)`` is not estimable from the pair itself; it is then taken from the
study's pooled paired-difference sd (``pooled_paired_sd``: the within-pair variances of every
shape that has two or more common seeds with the reference, pooled with their degrees of
freedom), which ``t`` uses as its ``df``. Tests and quantiles come from ``scipy.special`` (the distributions
of ``scipy.stats`` without its import).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from statistics import fmean, stdev

# the t distribution's cdf and quantile from scipy.special: scipy.stats takes a second to import, in every process
from scipy.special import stdtr, stdtrit

from nas.stats.scores import ShapeScores

ALPHA = 0.05  # two-sided 95 % intervals; tests at 5 %


@dataclass(frozen=True)
class PairedGain:
    """A shape's gain over a reference on their common seeds (see the module docstring)."""

    n: int  # common seeds used
    mean_difference: float  # mean of L_ref - L_shape (nats)
    gain_pct: float
    low_pct: float | None  # 95 % interval of gain_pct; None when no sd is available
    high_pct: float | None
    p_value: float | None  # two-sided, H0: no difference
    sd: float | None  # the paired-difference sd used (own, or pooled)
    pooled: bool = False  # sd from the study's pool rather than this pair
    posterior: bool = False  # a posterior (credible) interval of the shrunk gain (nas.stats.shrinkage), not a t one

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < ALPHA

    @property
    def interval_name(self) -> str:
        return "95 % credible interval" if self.posterior else "95 % CI"

    def interval_text(self) -> str:
        if self.low_pct is None:
            why = "1 paired seed: an interval needs 2" if self.n < 2 else f"{self.n} seeds"
            return f"{self.gain_pct:+.2f} % (no interval: {why})"
        count = f"{self.n} seeds" if self.posterior else f"{self.n} paired seeds"  # "n=3" read as paired seeds
        return f"{self.gain_pct:+.2f} % ({self.interval_name} [{self.low_pct:+.2f}, {self.high_pct:+.2f}], {count})"


def common_differences(shape: ShapeScores, reference: ShapeScores,
                       exclude_seeds: Iterable[int] = ()) -> list[tuple[int, float, float]]:
    """``(seed, d_s, L_ref,s)`` for the common seeds not excluded, ``d_s = L_ref,s - L_shape,s``."""
    skip = set(exclude_seeds)
    mine = dict(zip(shape.seeds, shape.losses))
    theirs = dict(zip(reference.seeds, reference.losses))
    return [(s, theirs[s] - mine[s], theirs[s]) for s in sorted(set(mine) & set(theirs) - skip)]


def pooled_paired_sd(scores: dict[str, ShapeScores], reference: str) -> tuple[float | None, int]:
    """The pooled sd of paired differences against ``reference`` over every shape with >= 2 common seeds, and its df."""
    ref = scores.get(reference)
    if ref is None:
        return None, 0
    sum_squares, df = 0.0, 0
    for key, shape in scores.items():
        if key == reference:
            continue
        d = [x for _, x, _ in common_differences(shape, ref)]
        if len(d) >= 2:
            sum_squares += (len(d) - 1) * stdev(d) ** 2
            df += len(d) - 1
    return (math.sqrt(sum_squares / df), df) if df else (None, 0)


def paired_gain(shape: ShapeScores, reference: ShapeScores, exclude_seeds: Iterable[int] = (),
                pooled: tuple[float | None, int] = (None, 0), alpha: float = ALPHA) -> PairedGain | None:
    """``shape``'s gain over ``reference`` on common seeds (None without any); ``pooled`` backs a single pair;
    the interval is two-sided at level ``1 - alpha`` (``alpha`` divided for simultaneous intervals)."""
    pairs = common_differences(shape, reference, exclude_seeds)
    if not pairs:
        return None
    d = [x for _, x, _ in pairs]
    n, mean_d, base = len(d), fmean(d), fmean(r for _, _, r in pairs)
    sd, df, from_pool = (stdev(d), n - 1, False) if n >= 2 else (pooled[0], pooled[1], True)
    if sd is None or df < 1:
        return PairedGain(n, mean_d, 100 * mean_d / base, None, None, None, None)
    se = sd / math.sqrt(n)
    half = float(stdtrit(df, 1 - alpha / 2)) * se
    if se > 0:
        p = float(2 * stdtr(df, -abs(mean_d) / se))
    else:
        p = 0.0 if mean_d != 0 else 1.0
    return PairedGain(n, mean_d, 100 * mean_d / base, 100 * (mean_d - half) / base, 100 * (mean_d + half) / base,
                      p, sd, from_pool and n < 2)


def holm_rejections(p_values: dict[str, float], alpha: float = ALPHA) -> set[str]:
    """Holm's step-down procedure: the hypotheses rejected at family-wise error ``alpha``."""
    rejected: set[str] = set()
    ordered = sorted(p_values.items(), key=lambda item: item[1])
    for i, (key, p) in enumerate(ordered):
        if p > alpha / (len(ordered) - i):
            break
        rejected.add(key)
    return rejected


def worse_than(scores: dict[str, ShapeScores], best: str) -> dict[str, float]:
    """One-sided p-values of "this shape is worse than ``best``" on common seeds, for every other shape that can be
    compared (a pair with one common seed takes the pooled paired sd of the others)."""
    pooled = pooled_paired_sd(scores, best)
    p_values = {}
    for key, shape in scores.items():
        if key == best:
            continue
        gain = paired_gain(shape, scores[best], pooled=pooled)  # gain of shape over best: negative when worse
        if gain is None or gain.sd is None:
            continue
        if gain.sd == 0:
            p_values[key] = 0.0 if gain.mean_difference < 0 else 1.0
            continue
        df = pooled[1] if gain.pooled else gain.n - 1
        t = -gain.mean_difference / (gain.sd / math.sqrt(gain.n))
        p_values[key] = float(stdtr(df, -t))
    return p_values


def tied_set(scores: dict[str, ShapeScores], best: str, alpha: float = ALPHA) -> list[str]:
    """Shapes not distinguishable from ``best``: ``best`` itself, then every shape that a one-sided paired test
    (H0: not worse than ``best``) with Holm's correction over all of them does not reject, in ranking order.

    A shape with no common seed with ``best`` cannot be compared and stays tied.
    """
    if best not in scores:
        return []
    worse = holm_rejections(worse_than(scores, best), alpha)
    tied = [key for key in scores if key != best and key not in worse]
    return [best] + sorted(tied, key=lambda key: (scores[key].mean, scores[key].first_trial))


@dataclass(frozen=True)
class RankAgreement:
    """Kendall tau between the proxy's ranking of some shapes and their order at full scale, with a bootstrap
    interval over the full-scale seeds (None when every shape has one: nothing to resample, and a zero-width
    interval would claim certainty)."""

    tau: float
    low: float | None
    high: float | None
    n_shapes: int
    top_overlap: int | None  # shapes in both top-k; None when there are no more than k shapes (it would read k)
    top_k: int

    def interval_text(self) -> str:
        """``95 % bootstrap interval [a, b] over the re-runs' seeds``, or why there is none."""
        if self.low is None or self.high is None:
            return "no interval: one re-run seed a shape, nothing to resample"
        return f"95 % bootstrap interval [{self.low:+.2f}, {self.high:+.2f}] over the re-runs' seeds"

    def overlap_text(self) -> str:
        """``; top-3 overlap 2 of 3``, or nothing where every shape is in the top k."""
        return "" if self.top_overlap is None else f"; top-{self.top_k} overlap {self.top_overlap} of {self.top_k}"

    def text(self) -> str:
        """``Kendall tau +0.33 (95 % bootstrap interval [..] over the re-runs' seeds, 4 shapes); top-3 overlap ..``"""
        return (f"Kendall tau {self.tau:+.2f} ({self.interval_text()}, {self.n_shapes} shapes){self.overlap_text()}")


def mean_loss_tau(first: dict[str, list[float]], second: dict[str, list[float]], top_k: int = 3,
                  resamples: int = 2000, seed: int = 0) -> RankAgreement | None:
    """tau between the shapes' mean loss in two sets of runs (shapes in both), and its 95 % bootstrap percentile
    interval: each resample draws every shape's seeds with replacement on both sides. For two designed panels with
    the same seeds a shape on each side (``benchmarks.proxy_fidelity``); a study's ranking is checked against its
    re-runs by ``kendall_tau``, which holds the leaderboard's ranks as they were printed."""
    keys = sorted(set(first) & set(second))
    if len(keys) < 2:
        return None
    tau = _tau([fmean(first[k]) for k in keys], [fmean(second[k]) for k in keys])
    overlap = _top_overlap(keys, lambda key: fmean(first[key]), lambda key: fmean(second[key]), top_k)
    k = min(top_k, len(keys))
    if all(len(first[key]) < 2 and len(second[key]) < 2 for key in keys):
        return RankAgreement(tau, None, None, len(keys), overlap, k)
    rng = random.Random(seed)
    draws = sorted(_tau([fmean(rng.choices(first[k], k=len(first[k]))) for k in keys],
                        [fmean(rng.choices(second[k], k=len(second[k]))) for k in keys]) for _ in range(resamples))
    low, high = draws[int(0.025 * resamples)], draws[min(resamples - 1, int(0.975 * resamples))]
    return RankAgreement(tau, low, high, len(keys), overlap, k)


def _tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two orderings of the same shapes; 0 where it is undefined (a constant side)."""
    from scipy import stats

    value = stats.kendalltau(a, b).statistic
    return 0.0 if value is None or math.isnan(value) else float(value)


def _top_overlap(keys: list[str], first: Callable[[str], float], second: Callable[[str], float],
                 top_k: int) -> int | None:
    """Shapes in both top-k (lowest first); None when there are no more than k shapes, where it would read k."""
    k = min(top_k, len(keys))
    if len(keys) <= k:
        return None
    return len(set(sorted(keys, key=first)[:k]) & set(sorted(keys, key=second)[:k]))


def kendall_tau(proxy_rank: dict[str, int], full: dict[str, list[float]], top_k: int = 3,
                resamples: int = 2000, seed: int = 0) -> RankAgreement | None:
    """tau between the proxy's ranks (the leaderboard's: 1 best) and the shapes' mean full-scale loss, over the
    shapes in both, and its 95 % bootstrap percentile interval: each resample draws every shape's full-scale seeds
    with replacement. The proxy's ranking is the answer being checked, so it is held as it was given: ranking by
    the shapes' raw mean proxy loss instead would rank a baseline over 8 seeds against shapes over 2 others, not
    the order the leaderboard (and ``nas rerun``) prints."""
    keys = sorted(set(proxy_rank) & set(full))
    if len(keys) < 2:
        return None
    ranks = [proxy_rank[k] for k in keys]
    tau = _tau(ranks, [fmean(full[k]) for k in keys])
    overlap = _top_overlap(keys, lambda key: proxy_rank[key], lambda key: fmean(full[key]), top_k)
    k = min(top_k, len(keys))
    if all(len(full[key]) < 2 for key in keys):
        return RankAgreement(tau, None, None, len(keys), overlap, k)
    rng = random.Random(seed)
    draws = sorted(_tau(ranks, [fmean(rng.choices(full[k], k=len(full[k]))) for k in keys]) for _ in range(resamples))
    low, high = draws[int(0.025 * resamples)], draws[min(resamples - 1, int(0.975 * resamples))]
    return RankAgreement(tau, low, high, len(keys), overlap, k)
