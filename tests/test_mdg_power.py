"""``benchmarks/mdg_power.py``: the answer's stated minimum detectable gain against a simulation of the study's own
design, judged by the answer's own test."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest

from benchmarks.mdg_power import check, detected, shifted, simulated_study, threshold
from reports.frame import study_data
from tests.test_race import play, search_of

ROOT = Path(__file__).resolve().parents[1]


def adaptive_study():
    search = search_of(trials=8 + 24, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    trials = play(search, {k: 3.0 + 0.01 * i for i, k in enumerate(keys)}, noise=0.05)
    return study_data("adaptive", [optuna.study.StudyDirection.MINIMIZE], trials,
                      {"nas:baseline_key": search.baseline.key(), "nas:identity": {"train": {"seed": 0}}})


def test_the_simulated_minimum_detectable_gain_is_detected_80_percent_of_the_time_by_fresh_draws():
    """The 80th percentile of the draws' detection thresholds, checked on draws it did not see: the answer's own
    test (the refitted robust interval) calls the leader better in about 80 % of them at that gain; and each
    threshold is where the call changes."""
    data = adaptive_study()
    result = check(data, draws=30, seed=1)
    assert result.leader != data.baseline_key and result.stated_gain > 0 and 0 <= result.power_at_stated <= 1
    low, middle, high = result.thresholds_quartiles
    assert 0 <= low <= middle <= high <= result.simulated_gain + 1e-12
    rng = np.random.default_rng(2)
    calls = []
    for i in range(60):
        draw = simulated_study(data.scores, data.baseline_key, result.leader, result.tau, result.sigma,
                               result.seed_sd, rng)
        calls.append(detected(shifted(draw, result.leader, -result.simulated_gain), result.leader, data.baseline_key))
        found = threshold(draw, result.leader, data.baseline_key) if i < 8 else 0.0
        if 0 < found < 4.0:  # the call flips at the threshold
            assert detected(shifted(draw, result.leader, -(found + 1e-3)), result.leader, data.baseline_key)
            assert not detected(shifted(draw, result.leader, -(found - 1e-3)), result.leader, data.baseline_key)
    assert np.mean(calls) == pytest.approx(0.8, abs=0.17)  # 60 fresh draws: se 0.05


def test_a_study_without_adaptive_replicates_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.mdg_power", "--storage",
                           f"sqlite:///{tmp_path / 'none.db'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "none.db").exists()
    data = adaptive_study()
    trials = [t for t in data.trials if t.user_attrs.get("role") not in ("adaptive", "adaptive-confirm")]
    data = study_data("first pass", data.directions, trials, data.attrs)
    with pytest.raises(ValueError, match="paired t-test"):
        check(data, draws=10)


def test_the_split_reads_the_design_not_the_losses_and_meets_the_paired_limit_when_the_shrinkage_lets_go():
    """``split_resolution``: on a study whose design already is the split (the leader and the baseline on ``n``
    common seeds, the rest on one), it states the answer's own minimum detectable gain at the same variance
    components, whatever the losses; it falls as the replicate trials grow, and with 400 of them (the shrinkage
    keeps almost all of a gain) it meets the paired t-test's allocation limit at the same paired sd."""
    from dataclasses import replace

    from benchmarks.mdg_power import split_resolution
    from nas.stats.comparisons import ALPHA
    from nas.stats.resolution import allocation_limit, gain_design, posterior_resolution
    from nas.stats.scores import ShapeScores
    from nas.stats.shrinkage import fit

    rng = np.random.default_rng(3)
    n, tau, sigma = 12, 0.03, 0.08
    keys = ["base", "lead", *(f"s{i}" for i in range(30))]
    scores = {}
    for i, key in enumerate(keys):
        seeds = tuple(range(n)) if key in ("base", "lead") else (0,)
        losses = tuple(3.0 + 0.01 * i + float(rng.normal(0, sigma)) for _ in seeds)
        scores[key] = ShapeScores(key, tuple(range(len(seeds))), seeds, losses)
    stated = posterior_resolution(replace(gain_design(scores, "lead", "base", fit(scores, known=(tau, sigma),
                                                                                  baseline="base")), df=40),
                                  n, n, ALPHA, scores["base"].mean)
    split = split_resolution(scores, "base", "lead", 2 * (n - 1), tau, sigma, 40, 1.0)
    assert split.gain == pytest.approx(stated.gain, rel=1e-9)
    budgets = (10, 40, 100, 400)
    gains = [split_resolution(scores, "base", "lead", r, tau, sigma, 40, 1.0).gain for r in budgets]
    assert gains == sorted(gains, reverse=True)
    limit = allocation_limit(math.sqrt(2) * sigma, 400, ALPHA, scores["base"].mean)
    assert gains[-1] / limit.gain == pytest.approx(1.0, abs=0.06)  # g = 201 / (201 + 7.1) = 0.97 at 400 trials


def test_the_draws_put_the_other_shapes_where_the_study_found_them():
    """The pack's centre behind the baseline (``-m_base`` of the plug-in fit) is where the draws put every shape but
    the leader and the baseline, so the shrinkage's pull of the leader towards the pack is drawn too."""
    data = adaptive_study()
    result = check(data, draws=10, seed=1)
    model = data.model(plug_in=True)
    component = max(model.components, key=lambda c: c.weight)
    assert result.pack == pytest.approx(-component.sol.m[model.keys.index(data.baseline_key)])
    rng = np.random.default_rng(4)
    draw = simulated_study(data.scores, data.baseline_key, result.leader, 1e-9, 1e-9, 1e-9, rng, pack=0.25)
    base = draw[data.baseline_key].mean
    assert draw[result.leader].mean == pytest.approx(base, abs=1e-6)
    assert all(shape.mean - base == pytest.approx(0.25, abs=1e-6) for key, shape in draw.items()
               if key not in (data.baseline_key, result.leader))
