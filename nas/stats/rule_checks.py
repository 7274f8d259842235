"""A rule's checks beyond its own fit: how it fared at a longer budget (``fidelity``), and whether the trials a fit
could not read lean on it (``selection_imbalance``). The fit itself is ``nas.stats.rules``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from nas.stats.comparisons import ALPHA
from nas.stats.rules import CARRIED, NOT_RESOLVED, RESOLVED, RuleEstimate, quantile

HELD, SHRANK, REVERSED = "held", "shrank", "reversed"
NOTHING_TO_CHECK = "nothing to check (not resolved at the proxy)"
NOT_CHECKED = "not checked"


def fidelity(proxy: RuleEstimate, longer: RuleEstimate) -> str:
    """How a rule read at the proxy fared at a longer budget (two independent studies):

    - **reversed**: the longer budget's interval excludes 0 on the other side;
    - **shrank**: the longer estimate has the proxy's sign, is closer to 0, and the difference's 95 % interval
      excludes 0 (Welch: ``|b_long - b_proxy| > t_df sqrt(sd_p^2 + sd_l^2)`` with Welch-Satterthwaite's ``df``,
      each side's own degrees of freedom);
    - **held**: the longer budget's interval excludes 0 on the proxy's side (and it did not shrink);
    - **not resolved**: otherwise (the longer interval holds 0 and the change is within the noise, or its sign
      flipped without the longer budget resolving it);
    - **not checked (<why>)**: the longer budget gives no estimate (too few shapes, confounded, not varied) or one
      shape carries it there, so the rule was not checked there at all, which "not resolved" misstated.

    A rule the proxy did not resolve claimed nothing to check: ``NOTHING_TO_CHECK`` (its estimates at both budgets
    are still shown)."""
    if proxy.verdict != RESOLVED:
        return NOTHING_TO_CHECK
    if not longer.estimated or longer.verdict == CARRIED:  # a longer budget's one shape decides nothing either
        return f"{NOT_CHECKED} ({longer.verdict})"
    if not (proxy.estimated and longer.estimated and proxy.estimate and longer.sd is not None
            and proxy.sd is not None and longer.low is not None and longer.high is not None):
        return NOT_RESOLVED
    sign = 1.0 if proxy.estimate > 0 else -1.0
    if (sign > 0 and longer.high < 0) or (sign < 0 and longer.low > 0):
        return REVERSED
    same_sign = sign * longer.estimate > 0  # type: ignore[operator]
    difference = abs(longer.estimate - proxy.estimate)  # type: ignore[operator]
    closer = abs(longer.estimate) < abs(proxy.estimate)  # type: ignore[arg-type]
    if same_sign and closer and difference > quantile(welch_df(proxy, longer)) * math.hypot(proxy.sd, longer.sd):
        return SHRANK
    if (sign > 0 and longer.low > 0) or (sign < 0 and longer.high < 0):
        return HELD
    return NOT_RESOLVED


def welch_satterthwaite(va: float, vb: float, df_a: float, df_b: float) -> float:
    """Degrees of freedom of a difference of two estimates with variances ``va``, ``vb`` on ``df_a``, ``df_b``:
    ``(va + vb)^2 / (va^2 / df_a + vb^2 / df_b)`` (Welch 1947, Satterthwaite 1946); ``inf`` when both are exact."""
    denominator = (va**2 / df_a if va else 0.0) + (vb**2 / df_b if vb else 0.0)
    return (va + vb) ** 2 / denominator if denominator > 0 else math.inf


def welch_df(a: RuleEstimate, b: RuleEstimate) -> int:
    """``welch_satterthwaite`` of two rules' estimates, each on its own degrees of freedom (at least 1)."""
    df = welch_satterthwaite((a.sd or 0.0) ** 2, (b.sd or 0.0) ** 2, max(a.df, 1), max(b.df, 1))
    return max(1, int(df)) if math.isfinite(df) else 10**6


def selection_imbalance(covariates: Mapping[str, Sequence[float]], kept: Sequence[str], left: Sequence[str],
                        names: Sequence[str], alpha: float = ALPHA) -> dict[str, float]:
    """The rules whose values differ between the shapes a fit read and those it left out (pruned or failed trials,
    whose final scores are missing): Welch's t-test per rule, ``{name: p value}`` below ``alpha``.

    The pruner stops a trial on its early loss, so a missing score is not missing at random: where the left-out
    shapes lean to one side of a rule, the fit sees only that side's survivors, and the rule reads milder than it
    is (or flips)."""
    from scipy.special import stdtr

    out = {}
    for j, name in enumerate(names):
        a = np.array([covariates[k][j] for k in kept if k in covariates], dtype=float)
        b = np.array([covariates[k][j] for k in left if k in covariates], dtype=float)
        if len(a) < 2 or len(b) < 2:
            continue
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        if va + vb <= 0:
            continue
        t = (a.mean() - b.mean()) / math.sqrt(va + vb)
        df = welch_satterthwaite(va, vb, len(a) - 1, len(b) - 1)
        p = float(2 * stdtr(df, -abs(t)))
        if p < alpha:
            out[name] = p
    return out
