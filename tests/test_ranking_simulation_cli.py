"""``python -m benchmarks.ranking_simulation``: figure 10's rows for some policies and noise levels, merged into the
recorded data without touching the rows it did not measure (the oracle reference: no planner, a second a study)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.ranking_simulation", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_one_noise_level_replaces_only_its_own_rows_and_records_the_run(tmp_path: Path) -> None:
    out = tmp_path / "figure10.json"
    kept = [{"policy": "oracle", "noise": "measured", "replicate trials": 24, "studies": 1000,
             "P(pick = true best)": 0.297},
            {"policy": "fixed", "noise": "paired sd x0.5", "replicate trials": 24, "studies": 1000,
             "P(pick = true best)": 0.601}]
    stale = {"policy": "oracle", "noise": "paired sd x0.5", "replicate trials": 24, "studies": 1000,
             "P(pick = true best)": 0.0}
    out.write_text(json.dumps({"what": "test", "runs": [], "rows": [*kept, stale]}))
    proc = run("--policies", "oracle", "--noises", "half", "--studies", "3", "--processes", "1",
               "--machine", "test", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert "partial" not in data
    assert all(row in data["rows"] for row in kept) and stale not in data["rows"]
    new = [r for r in data["rows"] if r["policy"] == "oracle" and r["noise"] == "paired sd x0.5"]
    assert [r["replicate trials"] for r in new] == [24, 47, 71] and {r["studies"] for r in new} == {3}
    assert data["runs"][-1]["noises"] == ["half"] and data["runs"][-1]["studies"] == 3


def test_an_unknown_noise_level_is_one_line_naming_the_valid_ones(tmp_path: Path) -> None:
    proc = run("--noises", "quiet", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "unknown noise level in 'quiet'; choose from measured, half" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def beside_figure_10(tmp_path: Path, *regime: str) -> dict:
    """The oracle's rows of another regime (3 studies) merged into a file holding one of figure 10's rows, which
    they must leave alone: the file's content."""
    out = tmp_path / "figure10.json"
    figure_10 = {"policy": "oracle", "noise": "measured", "replicate trials": 24, "studies": 1000,
                 "P(pick = true best)": 0.297}
    out.write_text(json.dumps({"what": "test", "runs": [], "rows": [figure_10]}))
    proc = run("--policies", "oracle", *regime, "--studies", "3", "--processes", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert figure_10 in data["rows"] and len(data["rows"]) == 4
    return data


def test_a_studys_own_noise_and_spread_are_rows_of_their_own_beside_figure_10s(tmp_path: Path) -> None:
    """--paired-sd and --spread measure another regime (a real study's, a flatter space) into the same file without
    replacing figure 10's rows of the same policy; the rows and the run say which regime they are."""
    data = beside_figure_10(tmp_path, "--paired-sd", "0.129", "--spread", "0.023")
    flat = [r for r in data["rows"] if r.get("true-mean sd") == 0.023]
    assert [(r["noise"], r["replicate trials"]) for r in flat] == [("paired sd 0.129", b) for b in (24, 47, 71)]
    assert data["runs"][-1]["true-mean sd"] == 0.023 and data["runs"][-1]["noises"] == ["paired sd 0.129"]


def test_a_spread_that_is_not_a_standard_deviation_is_one_line(tmp_path: Path) -> None:
    proc = run("--spread", "-1", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2
    assert "--spread -1.0 is not a standard deviation in nats; give one in (0, 10)" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_a_baseline_among_the_best_is_a_regime_of_its_own_rows(tmp_path: Path) -> None:
    """--baseline-z puts the baseline's true mean below the schedules' centre (the real space's regime, where the
    baseline is the posterior's pick); its rows say so and leave figure 10's (baseline mid-spread) alone."""
    import random

    from benchmarks.ranking_simulation import draw_truth

    keys = [f"s{i}" for i in range(129)]
    truth = draw_truth(keys, "s0", random.Random(1), 0.023, 1.645)
    assert truth.means["s0"] == 2.90 - 1.645 * 0.023 and truth.best != "s0"
    below = sum(mean < truth.means["s0"] for key, mean in truth.means.items() if key != "s0")
    assert 0 < below < 20  # about 5 % of 128 schedules draw better than a baseline at the 95th percentile
    data = beside_figure_10(tmp_path, "--noises", "measured", "--baseline-z", "1.645")
    assert [r["replicate trials"] for r in data["rows"] if r.get("baseline z") == 1.645] == [24, 47, 71]
    assert data["runs"][-1]["baseline z"] == 1.645


def test_a_baseline_z_outside_the_spread_is_one_line(tmp_path: Path) -> None:
    proc = run("--baseline-z", "nan", "--out", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "--baseline-z nan is not a place in the spread; give one in [-5, 5]" in proc.stderr
    assert not (tmp_path / "x.json").exists()
