"""``nas rules``: the design rules of a stored study, as a user reads them, bad input, and ``--confirm`` end to end."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.cli import app
from nas.study.records import shape_attrs
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space
from tests.search_helpers import sqlite_url


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def prism_db(tmp_path_factory) -> Path:
    """A synthetic 60-trial Prism study of the default cpu space in a real SQLite file."""
    path = tmp_path_factory.mktemp("rules") / "prism.db"
    synthetic_study(SyntheticSpec(space="prism", trials=60, seed=2), sqlite_url(path), name="prism")
    return path


def snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def test_the_table_names_every_default_rule_with_its_interval_and_verdict_and_writes_nothing(prism_db):
    before = snapshot(prism_db)
    result = invoke("rules", "--storage", sqlite_url(prism_db))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("study 'prism' at its proxy (cpu): ") and "over" in lines[0]
    assert any(line.split()[:1] == ["reduced_layers"] for line in lines)
    assert any(line.split()[:1] == ["log2_first_heads"] and "doubling of h_1" in line for line in lines)
    assert lines[-1].startswith("Resolved: ")
    assert snapshot(prism_db) == before  # a read-only command


def test_json_carries_the_issues_fields(prism_db):
    result = invoke("rules", "--storage", sqlite_url(prism_db), "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert {"study", "preset", "runs", "shapes", "rules", "fidelity"} <= set(out) and out["fidelity"] == []
    assert out["study"] == "prism" and out["preset"] == "cpu" and out["shapes"] > 40
    for rule in out["rules"]:
        assert {"name", "unit", "estimate", "ci95", "percent", "mdg", "verdict"} <= set(rule)
        low, high = rule["ci95"]
        assert low < rule["estimate"] < high and rule["mdg"] > 0
        assert rule["verdict"] == ("resolved" if low > 0 or high < 0 else "not resolved")


def test_opt_in_rules_are_read_when_named(prism_db):
    result = invoke("rules", "--storage", sqlite_url(prism_db), "--rules", "prism_steps,log2_first_heads",
                    "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(result.stdout)["rules"]] == ["prism_steps", "log2_first_heads"]


def k1_hourglass_db(path: Path) -> str:
    """Three shapes of the tiny Hourglass grid, every one with K = 1, on two seeds each."""
    space = build_space(SpaceOptions(space="hourglass"), defaults=get_preset("tiny").baseline)
    shapes = [a for a in space if a.ffn.k == 1][:3]
    url = sqlite_url(path)
    study = optuna.create_study(storage=url, study_name="k1")
    study.set_user_attr("nas:baseline_key", space.baseline().key())
    study.set_user_attr("nas:identity", {"space": space.describe(), "train": {"seed": 0}})
    study.set_user_attr("nas:preset", "tiny")
    for seed in range(2):
        for i, arch in enumerate(shapes):
            loss = 3.0 + 0.01 * i + 0.02 * seed
            study.add_trial(optuna.trial.create_trial(value=loss, user_attrs={
                **shape_attrs(arch, seed, "baseline" if i == seed == 0 else "member"), "val_loss": loss}))
    return url


@pytest.mark.parametrize("args, says", [
    (("--rules", "no_such_rule"), "unknown rule 'no_such_rule'; this study's rules are reduced_layers, "),
    (("--rules", "K_gt_1"), "unknown rule 'K_gt_1'"),  # an Hourglass rule, not in a Prism study's catalog
    (("--shapes", "4"), "--shapes goes with --confirm PRESET"),
    (("--confirm", "no-such-preset"), "no-such-preset"),
    (("--confirm", "cpu"), "no more than the study's proxy (32,768)"),
    (("--confirm", "cpu-long", "--seeds", "0"), "--seeds 0 is invalid"),
    (("--confirm", "cpu-long", "--shapes", "99999999999"), "--shapes 99999999999 is invalid: give 1-1,000"),
    (("--confirm", "cpu-long", "--shapes", "5"), "--shapes 5 is too few to check 2 rule(s)"),
    (("--confirm", "cpu-long", "--rules", "reduced_layers"), "no rule of reduced_layers is resolved at the proxy"),
    (("--rules", "log2_first_heads,no"), "unknown rule 'no'"),
    (("--rules", ""), "--rules '' names no rule; this study's rules are reduced_layers, "),  # it read the defaults
])
def test_bad_input_is_one_line_with_exit_2_and_writes_nothing(prism_db, tmp_path, args, says):
    before = snapshot(prism_db)
    result = invoke("rules", "--storage", sqlite_url(prism_db), "--runs", str(tmp_path / "runs"), *args) \
        if "--confirm" in args else invoke("rules", "--storage", sqlite_url(prism_db), *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and says in result.stderr and "Traceback" not in result.output
    assert snapshot(prism_db) == before and not (tmp_path / "runs").exists()


def test_a_rule_that_does_not_vary_and_a_study_of_two_shapes_are_refused(tmp_path):
    url = k1_hourglass_db(tmp_path / "k1.db")
    result = invoke("rules", "--storage", url, "--rules", "K_gt_1")
    assert result.exit_code == 2 and "K_gt_1 does not vary in study 'k1'" in result.stderr
    assert invoke("rules", "--storage", url).exit_code == 0  # the default catalog says "not varied" instead
    small = optuna.load_study(study_name="k1", storage=url)
    keep = {t.user_attrs["key"] for t in small.get_trials()}
    two = sorted(keep)[:2]
    other = optuna.create_study(storage=sqlite_url(tmp_path / "two.db"), study_name="two")
    for key, value in small.user_attrs.items():
        other.set_user_attr(key, value)
    other.add_trials([t for t in small.get_trials() if t.user_attrs["key"] in two])
    result = invoke("rules", "--storage", sqlite_url(tmp_path / "two.db"))
    assert result.exit_code == 2 and "the rules need at least 3" in result.stderr


def test_confirm_refuses_a_storage_it_cannot_write_before_training(prism_db, tmp_path, monkeypatch):
    """A read-only file (as a user other than root sees it: ``os.access`` is what the check asks) is refused in one
    line before anything is planned or written."""
    copy = tmp_path / "ro.db"
    copy.write_bytes(prism_db.read_bytes())
    os.chmod(copy, stat.S_IRUSR | stat.S_IRGRP)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == copy and mode & os.W_OK
                        else real_access(path, mode))
    before = snapshot(copy)
    result = invoke("rules", "--storage", sqlite_url(copy), "--confirm", "cpu-long", "--runs", str(tmp_path / "runs"))
    assert result.exit_code == 2 and "is read-only" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists() and snapshot(copy) == before


@pytest.mark.slow
def test_confirm_trains_a_designed_sample_once_and_reads_the_rules_at_both_budgets(tmp_path):
    """A tiny Hourglass study confirmed at twice its tokens: the baseline and 2 designed shapes are trained (real
    runs, `nas train` children) and recorded; a second call trains nothing; the JSON then carries the longer budget
    with a fidelity verdict per rule."""
    url = sqlite_url(tmp_path / "hg.db")
    synthetic_study(SyntheticSpec(space="hourglass", preset="tiny", trials=40, seed=1), url, name="hg")
    args = ("rules", "--storage", url, "--rules", "log2_d_over_L", "--confirm", "tiny", "--tokens", "8k",
            "--shapes", "5", "--seeds", "1", "--runs", str(tmp_path / "runs"), "--threads", "1")
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "confirm at tiny: the baseline and 5 shapes spanning log2_d_over_L (resolved at the proxy: " in \
        first.stderr
    assert first.stderr.count("training in") == 6 and "at tiny (8,000 tokens, data builtin)" in first.stdout
    second = invoke(*args, "--format", "json")
    assert second.exit_code == 0 and "training in" not in second.stderr
    assert second.stderr.count("recorded already") == 6
    out = json.loads(second.stdout)
    (budget,) = out["fidelity"]
    # labelled with its tokens: "tiny" alone read as tiny's own 4,096
    assert budget["budget"] == "tiny (8,000 tokens, data builtin)" and budget["shapes"] == 6 and budget["runs"] == 6
    (rule,) = budget["rules"]
    assert rule["verdict"] in ("resolved", "not resolved") and rule["ci95"][0] < rule["estimate"] < rule["ci95"][1]
    assert rule["fidelity"] in ("held", "shrank", "reversed", "not resolved")  # resolved at the proxy: checked


def test_a_square_without_its_rule_and_a_confirm_without_a_baseline_are_refused(tmp_path, prism_db):
    url = k1_hourglass_db(tmp_path / "k1.db")
    result = invoke("rules", "--storage", url, "--rules", "log2_d_over_L_sq")
    assert result.exit_code == 2 and "log2_d_over_L_sq is the square of log2_d_over_L; give both" in result.stderr
    study = optuna.load_study(study_name="prism", storage=sqlite_url(prism_db))
    baseline = study.user_attrs["nas:baseline_key"]
    failed = optuna.create_study(storage=sqlite_url(tmp_path / "nobase.db"), study_name="nobase")
    for key, value in study.user_attrs.items():
        failed.set_user_attr(key, value)
    trials = [t for t in study.get_trials() if t.user_attrs.get("key") != baseline][:12]
    failed.add_trials(trials)
    result = invoke("rules", "--storage", sqlite_url(tmp_path / "nobase.db"), "--confirm", "cpu-long", "--runs",
                    str(tmp_path / "runs"))
    assert result.exit_code == 2 and "has no completed baseline" in result.stderr, result.output
    assert not (tmp_path / "runs").exists()
