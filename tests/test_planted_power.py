"""``benchmarks/planted_power.py``: the search's power to find and declare a shape planted better than the baseline,
on the known truths of ``benchmarks/ranking_simulation.py``, planned by the real planner, answered by the real
summary."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.planted_power import planted, row, study
from benchmarks.ranking_simulation import PAIRED_SD, Truth

ROOT = Path(__file__).resolve().parents[1]


def test_planting_moves_one_shape_other_than_the_baseline_to_its_gain_below_the_baseline():
    means = {"base": 2.90, **{f"s{i}": 2.91 + 0.01 * i for i in range(20)}}
    truth = Truth(means, "base", "base")
    moved, key = planted(truth, random.Random(1), 5.0)
    assert key != "base" and moved.means[key] == pytest.approx(2.90 * 0.95)
    assert {k: v for k, v in moved.means.items() if k != key} == {k: v for k, v in means.items() if k != key}
    assert moved.best == key and moved.baseline == "base"
    unmoved, key = planted(truth, random.Random(1), 0.0)
    assert unmoved.means[key] == 2.90 and unmoved.best == "base"  # level with the baseline: the first of the tie


def test_a_shape_planted_far_better_is_found_and_declared():
    """30 % better (0.87 nats at a paired sd of 0.111): the real planner finds it and the real summary declares it,
    in each of two studies; the row says so."""
    outcomes = [study(("adaptive", 30.0, seed, PAIRED_SD, 0.060, 0.0, 24)) for seed in (3, 4)]
    assert all(o["planted_declared"] == 1.0 and o["pick_is_planted"] == 1.0 and o["planted_seeds"] >= 2
               for o in outcomes), outcomes
    summary = row(30.0, outcomes)
    assert summary["P(answer: the planted one beats it)"] == 1.0
    assert summary["P(planted declared | pick = planted)"] == 1.0 and summary["studies"] == 2
    assert summary["stated power at the planted gain | pick = planted"] > 0.99  # the answer says it could not miss


@pytest.mark.parametrize("flags, message", [(["--gains", "5,x"], "is not a list of numbers"),
                                            (["--gains", "120"], "in [0, 100)"),
                                            (["--policy", "oracle"], "unknown policy 'oracle'")])
def test_bad_input_is_one_line_and_exit_2(flags, message):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.planted_power", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
