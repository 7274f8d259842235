"""``benchmarks/mdg_power.py``: the answer's stated minimum detectable gain against a simulation of the study's own
design, judged by the answer's own test."""

from __future__ import annotations

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
    data.trials = [t for t in data.trials if t.user_attrs.get("role") not in ("adaptive", "adaptive-confirm")]
    with pytest.raises(ValueError, match="paired t-test"):
        check(data, draws=10)
