"""The minimum detectable gain: the power formula against a simulation of the very test the summary makes."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import optuna
import pytest
from scipy import stats

from nas.arch import uniform
from nas.stats.mixed_model import design_sums, solve
from nas.stats.resolution import (
    detectable_gain,
    gain_design,
    posterior_power,
    posterior_resolution,
    power,
    seeds_needed,
)
from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import credible_quantile
from nas.study.records import shape_attrs
from reports.frame import read_study
from reports.summary import summarise


def simulated_power(delta: float, sd: float, n: int, alpha: float, studies: int = 40_000, seed: int = 0) -> float:
    """How often the lower end of the two-sided ``1 - alpha`` t interval of ``n`` paired differences is above 0."""
    rng = np.random.default_rng(seed)
    d = rng.normal(delta, sd, size=(studies, n))
    low = d.mean(axis=1) - stats.t.ppf(1 - alpha / 2, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return float((low > 0).mean())


@pytest.mark.parametrize(("sd", "n", "alpha"), [(0.108, 8, 0.05 / 8), (0.05, 3, 0.05), (0.02, 30, 0.05)])
def test_the_minimum_detectable_gain_is_detected_80_percent_of_the_time_in_simulation(sd, n, alpha):
    delta = detectable_gain(sd, n, alpha)
    assert simulated_power(delta, sd, n, alpha) == pytest.approx(0.8, abs=0.01)  # 40k studies: se 0.002
    assert simulated_power(0.0, sd, n, alpha) == pytest.approx(alpha / 2, abs=0.004)  # no gain: the test's level
    assert simulated_power(delta / 2, sd, n, alpha) < 0.5  # a smaller gain is mostly missed
    assert delta > (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(0.8)) * sd / math.sqrt(n)  # t is wider than z


def test_seeds_needed_is_the_fewest_that_reach_the_gain():
    sd, alpha, gain = 0.108, 0.05, 0.0304  # the default proxy's paired sd; 1 % of a loss of 3.04
    n = seeds_needed(gain, sd, alpha)
    assert detectable_gain(sd, n, alpha) <= gain < detectable_gain(sd, n - 1, alpha)
    assert n == pytest.approx(((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * sd / gain) ** 2, rel=0.05)
    assert power(gain, sd, n, alpha) >= 0.8


def known_noise_study(paired_sd: float, seeds: int, gain: float = 0.0, seed: int = 0) -> optuna.Study:
    """The baseline and three Prism shapes on ``seeds`` common seeds: a shared seed effect, each shape's own noise
    of sd ``paired_sd / sqrt(2)`` (so paired differences have sd ``paired_sd``), the first shape ``gain`` better."""
    rng = random.Random(seed)
    study = optuna.create_study(study_name="known-noise")
    base = uniform(4, 32, 4, 256)
    shapes = [base] + [base.replace(heads=heads) for heads in ([2, 2, 4, 4], [1, 1, 4, 4], [2, 4, 4, 4])]
    study.set_user_attr("nas:baseline_key", base.key())
    for s in range(seeds):
        shared = rng.gauss(0, 0.1)
        for i, arch in enumerate(shapes):
            loss = 3.0 + shared + rng.gauss(0, paired_sd / math.sqrt(2)) - (gain if i == 1 else 0.0)
            role = ("baseline" if s == 0 else "replicate") if i == 0 else ("member" if s == 0 else "replicate")
            study.add_trial(optuna.trial.create_trial(value=loss, user_attrs={**shape_attrs(arch, s, role),
                                                                              "val_loss": loss}))
    return study


def test_a_study_with_known_noise_states_the_gain_it_could_have_detected():
    summary = summarise(read_study(known_noise_study(paired_sd=0.05, seeds=12)))
    res = summary.resolution
    assert res is not None and res.sd == pytest.approx(0.05, rel=0.3) and res.n == 11  # seed 0 selected the leader
    assert res.gain == pytest.approx(detectable_gain(res.sd, 11, res.alpha))
    assert "this study would have detected a gain of" in summary.sentence and "not a smaller one" in summary.sentence
    assert f"{res.gain_pct:.2f} %" in summary.sentence and "a 1 % gain needs" in summary.detail


def test_a_real_gain_well_above_the_resolution_is_found_and_carries_it():
    summary = summarise(read_study(known_noise_study(paired_sd=0.02, seeds=12, gain=0.1)))
    assert "beats the baseline by" in summary.sentence and "minimum detectable gain" in summary.sentence
    assert summary.resolution.gain < 0.1


def test_without_a_second_common_seed_the_resolution_is_said_to_be_unknown():
    summary = summarise(read_study(known_noise_study(paired_sd=0.05, seeds=1)))
    assert summary.resolution is None and "is not known yet" in summary.sentence


def test_a_shrunk_gains_credible_interval_detects_its_minimum_detectable_gain_80_percent_of_the_time():
    """After adaptive replicates (``posterior_resolution``): at the plug-in posterior's lambda and s2, scores drawn
    with the leader ``MDG`` better and every other shape level with the baseline put the lower end of the leader's
    95 % credible gain interval above 0 in 80 % of 20,000 draws, whatever the seed effects."""
    rng = np.random.default_rng(3)
    seeds_of = {"base": [0, 1], "lead": list(range(12)), **{f"o{i}": [0] for i in range(8)},
                "p": [0, 1, 2], "q": [0, 2]}  # a leader on many seeds, a baseline on two (a typical adaptive study)
    keys = list(seeds_of)
    shape = np.array([k for k, key in enumerate(keys) for _ in seeds_of[key]])
    seed = np.array([s for key in keys for s in seeds_of[key]])
    levels = {key: rng.normal(0, 0.05) for key in keys}  # a first draw only to fit lambda and s2 from
    y0 = np.array([levels[keys[k]] + rng.normal(0, 0.08) for k in shape]) + 3.0
    scores = {key: ShapeScores(key, tuple(range(len(seeds_of[key]))), tuple(seeds_of[key]),
                               tuple(float(v) for v in y0[shape == k])) for k, key in enumerate(keys)}
    design = gain_design(scores, "lead", "base")
    assert design is not None and 0 < design.g < 1 and 0 < design.c2 < design.q  # shrinkage keeps part of a gain
    res = posterior_resolution(design, 12, 2, 0.05, 3.0)
    assert res is not None and res.baseline_n == 2 and "credible interval" in res.text()
    assert posterior_power(design, res.gain, 0.05) == pytest.approx(0.8)  # the power the MDG is the 80 % point of
    quantile = credible_quantile(design.df)  # the interval's own: Student t at the residual df
    half = quantile * math.sqrt(design.s2 * design.q)
    lead, base = keys.index("lead"), keys.index("base")
    ridge = np.where(np.arange(len(keys)) == base, 0.0, design.lam)  # (S,): the baseline a fixed effect, unshrunk

    def detected(delta: float, draws: int = 20_000, widening: float = 1.0) -> float:
        truth = np.where(shape == lead, -delta, 0.0)  # (n,)
        hits = 0
        for _ in range(draws):
            y = 3.0 + truth + rng.normal(0, 0.3, 12)[seed] + rng.normal(0, math.sqrt(design.s2), len(y0))
            sol = solve(design_sums(shape, seed, y, len(keys), 12), ridge)
            hits += -(sol.m[lead] - sol.m[base]) - widening * half > 0
        return hits / draws

    assert detected(res.gain) == pytest.approx(0.8, abs=0.01)  # 20k draws: se 0.003
    # the answer's robust interval (nas.stats.board._gains_of) reaches 1.3 normal half-widths on the better side:
    # its minimum detectable gain is larger, and detected 80 % of the time with that end
    wider = posterior_resolution(replace(design, widening=1.3), 12, 2, 0.05, 3.0)
    assert wider is not None and wider.gain > res.gain
    assert detected(wider.gain, 10_000, 1.3) == pytest.approx(0.8, abs=0.015)  # 10k draws: se 0.004
    assert posterior_power(replace(design, widening=1.3), wider.gain, 0.05) == pytest.approx(0.8)
    half_way = res.gain / 2
    assert detected(half_way, 10_000) == pytest.approx(posterior_power(design, half_way, 0.05), abs=0.015)
    # no gain: the credible interval is wider than its estimate's own spread (c2 < q), so it claims a gain less
    # often than a t test's alpha / 2, exactly Phi(-z sqrt(q / c2))
    no_gain = float(stats.norm.sf(quantile * math.sqrt(design.q / design.c2)))
    assert detected(0.0) == pytest.approx(no_gain, abs=0.002) and no_gain < 0.025
    assert posterior_power(design, 0.0, 0.05) == pytest.approx(no_gain)


def test_the_allocation_limit_is_an_even_split_of_the_replicates_on_common_seeds():
    """An oracle that knew the pick splits 71 replicate trials between it and the baseline: 36 paired seeds with the
    first pass's. At the default proxy's paired sd (0.108 nats) that detects about 1.7 % of a 2.95 loss."""
    from nas.stats.resolution import allocation_limit, detectable_gain

    limit = allocation_limit(0.108, 71, 0.05, 2.95)
    assert limit.n == 36 and limit.gain == pytest.approx(detectable_gain(0.108, 36, 0.05))
    assert 1.6 < limit.gain_pct < 1.9
    assert allocation_limit(0.108, 1, 0.05, 2.95) is None and allocation_limit(None, 71, 0.05, 2.95) is None
    # the sentence states it beside the study's own minimum detectable gain
    summary = summarise(read_study(known_noise_study(paired_sd=0.05, seeds=6)))
    assert summary.resolution is not None and summary.limit is not None  # 20 replicate trials: 11 paired seeds
    assert summary.limit.n == 11 and summary.limit.gain <= summary.resolution.gain
    assert f"allocation limit at this noise and 20 replicate trials is {summary.limit.gain_pct:.2f} %" in \
        summary.detail
