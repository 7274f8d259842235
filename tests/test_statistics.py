"""Paired comparisons, the tied set, Kendall tau and the width-depth fit, against known truths."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats

from nas.stats.comparisons import (
    holm_rejections,
    kendall_tau,
    mean_loss_tau,
    paired_gain,
    pooled_paired_sd,
    tied_set,
)
from nas.stats.scores import ShapeScores
from reports.width_depth import WidthDepthPoint, fit_width_depth


def shape(key: str, losses: list[float], seeds: list[int] | None = None) -> ShapeScores:
    seeds = seeds if seeds is not None else list(range(len(losses)))
    return ShapeScores(key, tuple(range(len(losses))), tuple(seeds), tuple(losses))


def test_paired_gain_is_the_t_interval_of_the_paired_differences():
    base = shape("b", [3.00, 3.10, 2.95, 3.05])
    better = shape("c", [2.97, 3.08, 2.93, 3.01])
    gain = paired_gain(better, base)
    d = np.array([0.03, 0.02, 0.02, 0.04])
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert gain.n == 4 and gain.mean_difference == pytest.approx(d.mean())
    assert gain.gain_pct == pytest.approx(100 * d.mean() / 3.025)
    assert gain.low_pct == pytest.approx(100 * (d.mean() - half) / 3.025)
    assert gain.p_value == pytest.approx(stats.ttest_rel([3.00, 3.10, 2.95, 3.05], [2.97, 3.08, 2.93, 3.01]).pvalue)
    assert gain.significant and not gain.pooled
    # excluding a seed uses only the rest; a seed the shapes do not share is not compared
    assert paired_gain(better, base, exclude_seeds={0}).n == 3
    assert paired_gain(shape("x", [3.0], [9]), base) is None


def test_a_single_common_seed_borrows_the_studys_pooled_paired_sd():
    base = shape("b", [3.0, 3.1, 3.2])
    scores = {"b": base, "c": shape("c", [2.9, 3.05, 3.1]), "d": shape("d", [2.95, 3.0, 3.3]),
              "one": shape("one", [2.99])}
    sd, df = pooled_paired_sd(scores, "b")
    by_hand = math.sqrt((2 * np.var([0.1, 0.05, 0.1], ddof=1) + 2 * np.var([0.05, 0.1, -0.1], ddof=1)) / 4)
    assert df == 4 and sd == pytest.approx(by_hand)
    gain = paired_gain(scores["one"], base, pooled=(sd, df))
    assert gain.n == 1 and gain.pooled and gain.low_pct is not None
    assert paired_gain(scores["one"], base).low_pct is None  # no pool: no interval


def test_holm_rejects_step_down():
    assert holm_rejections({"a": 0.001, "b": 0.02, "c": 0.04}) == {"a", "b", "c"}  # 0.0167, 0.025, 0.05
    assert holm_rejections({"a": 0.001, "b": 0.02, "c": 0.06}) == {"a", "b"}
    assert holm_rejections({"a": 0.001, "b": 0.03, "c": 0.04}) == {"a"}  # 0.03 > 0.05 / 2 stops it
    assert holm_rejections({}) == set()


def test_tied_set_keeps_what_cannot_be_told_from_the_best_and_drops_clearly_worse_shapes():
    rng = random.Random(0)
    noise = [rng.gauss(0, 0.05) for _ in range(8)]  # shared per seed: what pairing removes
    scores = {key: shape(key, [3.0 + offset + n + rng.gauss(0, 0.003) for n in noise])
              for key, offset in (("best", 0.0), ("close", 0.001), ("worse", 0.03), ("much", 0.1))}
    tied = tied_set(scores, "best")
    assert tied[0] == "best" and "close" in tied and "worse" not in tied and "much" not in tied


def test_kendall_tau_and_its_bootstrap_interval_over_the_reruns_seeds():
    ranks = {k: r for r, k in enumerate("abcdef", start=1)}
    full = {k: [r + 0.01 * i for i in range(3)] for k, r in ranks.items()}
    same = kendall_tau(ranks, full)
    assert same.tau == pytest.approx(1.0) and same.low == pytest.approx(1.0) and same.top_overlap == 3
    assert same.text() == ("Kendall tau +1.00 (95 % bootstrap interval [+1.00, +1.00] over the re-runs' seeds, "
                           "6 shapes); top-3 overlap 3 of 3")
    reversed_ = kendall_tau(ranks, {k: [-v for v in losses] for k, losses in full.items()})
    assert reversed_.tau == pytest.approx(-1.0) and reversed_.top_overlap == 0
    noisy = kendall_tau(ranks, {k: [r + e for e in (-2, 0, 2)] for k, r in ranks.items()})
    assert noisy.low < noisy.tau <= noisy.high and noisy.high - noisy.low > 0.3  # seeds this noisy: a wide interval
    assert kendall_tau({"a": 1}, {"a": [2.0]}) is None
    # one seed a shape: nothing to resample; the interval was [tau, tau], as if certain
    single = kendall_tau(ranks, {k: [float(r)] for k, r in ranks.items()})
    assert single.tau == pytest.approx(1.0) and single.low is None and single.high is None
    assert single.interval_text().startswith("no interval: one re-run seed a shape")


def test_mean_loss_tau_of_two_panels_resamples_both_sides():
    first = {k: [v + 0.01 * i for i in range(3)] for k, v in zip("abcdef", (1, 2, 3, 4, 5, 6))}
    same = mean_loss_tau(first, {k: [v[0] * 10] for k, v in first.items()})
    assert same.tau == pytest.approx(1.0) and same.low == pytest.approx(1.0) and same.top_overlap == 3
    assert mean_loss_tau(first, {k: [-v[0]] for k, v in first.items()}).tau == pytest.approx(-1.0)
    noisy = mean_loss_tau({k: [v[0] + e for e in (-2, 0, 2)] for k, v in first.items()}, first)
    assert noisy.low < noisy.tau <= noisy.high and noisy.high - noisy.low > 0.3  # noisy on the first side: wide
    single = mean_loss_tau({k: [v[0]] for k, v in first.items()}, {k: [v[0] * 10] for k, v in first.items()})
    assert single.low is None and mean_loss_tau({"a": [1.0]}, {"a": [2.0]}) is None


def test_kendall_tau_reads_the_ranks_it_is_given_and_no_overlap_where_every_shape_is_in_the_top_k():
    # the leaderboard put the baseline first, the re-run put it last: tau -0.33 against the printed ranks (the proxy's
    # raw mean losses, the baseline's over 8 seeds and the others' over 2 other seeds, had read +1.00)
    agreement = kendall_tau({"base": 1, "x": 2, "y": 3}, {"base": [2.733, 2.733], "x": [2.698, 2.698],
                                                          "y": [2.716, 2.716]})
    assert agreement.tau == pytest.approx(-1 / 3)
    # "top-3 overlap 3" of 3 shapes said nothing
    assert agreement.top_overlap is None and agreement.text().endswith("3 shapes)")


@pytest.mark.parametrize("optimum", [40.0, 150.0])
def test_the_width_depth_fit_recovers_a_known_optimum(optimum):
    """Points drawn around a U-curve in log(d_model/L) with seed noise: the fitted minimum lands near the truth and
    its bootstrap interval covers it."""
    rng = np.random.default_rng(1)
    ratios = np.exp(np.linspace(math.log(optimum / 8), math.log(optimum * 8), 12))

    def truth(r: float) -> float:
        return 3.0 + 0.05 * math.log(r / optimum) ** 2

    points = [WidthDepthPoint(f"r{r:.0f}", float(r), tuple(truth(r) + rng.normal(0, 0.01, size=3)))
              for r in ratios]
    fit = fit_width_depth(points, resamples=500)
    assert fit.minimum_inside and abs(math.log(fit.minimum / optimum)) < 0.2
    assert fit.low < optimum < fit.high and fit.bootstrap_misses == 0
    assert fit.c == pytest.approx(0.05, rel=0.2) and fit.resolved


def test_a_minimum_half_the_resamples_lack_states_no_interval_and_no_optimum():
    """Half the resamples without a minimum: their percentiles, [0.0859, 4.36e+03], left the fitted 6.56e+03 outside
    its own "95 % interval", and the report called it "This study's optimum"."""
    from reports.curves import interval_text
    from reports.width_depth import QuadraticFit

    lacking = QuadraticFit(0, 0, 1, 16, 6560.0, 0.0859, 4360.0, 0.51, (2.0, 64.0))
    assert not lacking.bounded and not lacking.resolved
    assert interval_text(lacking) == " (no interval: 51 % of the resamples have no minimum)"
    outside = QuadraticFit(0, 0, 1, 16, 30.0, 35.0, 60.0, 0.1, (2.0, 64.0))  # the fit beside its resamples' interval
    assert not outside.bounded
    some = QuadraticFit(0, 0, 1, 119, 5.17, 3.9, 7.1, 0.13, (2.0, 184.0))
    assert some.resolved and interval_text(some) == " (95 % bootstrap interval [3.9, 7.1] of the 87 % of resamples " \
                                                    "with a minimum)"


def test_a_monotone_curve_has_no_minimum_and_too_few_points_no_fit():
    points = [WidthDepthPoint(str(r), r, (3.0 - 0.1 * math.log(r),)) for r in (2.0, 4.0, 8.0, 16.0)]
    fit = fit_width_depth(points, resamples=100)
    assert fit is not None and (fit.minimum is None or not fit.minimum_inside)
    assert fit_width_depth(points[:2]) is None
