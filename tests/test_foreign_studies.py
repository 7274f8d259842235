"""A storage shared with other studies: a study `nas search` did not make, and trials whose stored attrs are unreadable.

Users keep other Optuna studies in the same database (a learning-rate sweep in ``nas.db``, one
PostgreSQL database for a group). ``nas best``, ``nas report`` and ``nas export`` refuse such a
study in one line (exit 2), ``nas studies`` says which studies are shape searches, and a shape
search whose trials were edited by hand (or written by another version) is read with each
unreadable trial skipped and named in one warning.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess

import optuna
import pytest
from search_helpers import NAS, nas_env
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.cli import app


def lr_sweep(storage: str, trials: int = 5) -> None:
    """An ordinary Optuna study: ``suggest_float("x", ...)``, ``trials`` completed trials."""
    study = optuna.create_study(storage=storage, study_name="lr-sweep")
    study.optimize(lambda trial: (trial.suggest_float("x", -1, 1) - 0.3) ** 2, n_trials=trials)


@pytest.fixture
def shared(tmp_path) -> str:
    """A storage holding one shape search (``prism``) and one learning-rate sweep (``lr-sweep``)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'nas.db'}"
    synthetic_study(SyntheticSpec(space="prism", trials=30), storage=storage, name="prism")
    lr_sweep(storage)
    return storage


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", [["best"], ["export"], ["report", "--plotlyjs", "cdn"], ["rerun", "--preset",
                                                                                            "tiny"]])
def test_a_study_that_nas_search_did_not_make_is_refused_in_one_line(tmp_path, shared, command):
    out = ["-o", str(tmp_path / "r.html")] if command[0] == "report" else []
    result = invoke(*command, "--storage", shared, "--study-name", "lr-sweep", *out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "'lr-sweep'" in lines[0] and "is not a shape search" in lines[0] and "prism" in lines[0], lines[0]
    assert "Traceback" not in result.output and not (tmp_path / "r.html").exists()


def test_without_a_study_name_the_only_shape_search_is_read(tmp_path, shared):
    result = invoke("best", "--storage", shared)
    assert result.exit_code == 0, result.output
    assert "(baseline)" in result.stdout and "no completed trials" not in result.stdout


def test_nas_studies_says_which_studies_are_shape_searches(tmp_path, shared):
    result = invoke("studies", "--storage", shared)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert result.stdout.splitlines()[0].split() == ["study", "trials", "trained", "kind"]
    trials = optuna.load_study(study_name="prism", storage=shared).trials
    assert len(trials) > 30  # 30 trained and the duplicates answered from them, which --trials does not count
    assert rows["prism"].endswith("shape search") and rows["prism"].split()[1:3] == [str(len(trials)), "30"]
    assert rows["lr-sweep"].endswith("not a shape search") and rows["lr-sweep"].split()[1:3] == ["5", "-"]


def test_nas_studies_aligns_its_columns_under_wide_characters(tmp_path, shared):
    """Issue 52: a study name of CJK characters (two terminal columns each) pushed its row's columns right."""
    from rich.cells import cell_len

    optuna.create_study(storage=shared, study_name="学習率の探索")
    result = invoke("studies", "--storage", shared)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 4 and any(line.startswith("学習率の探索 ") for line in lines)
    counts = [re.match(r"^(.*?) +(\d+|trials)  ", line) for line in lines]
    assert {cell_len(line[:m.end(2)]) for line, m in zip(lines, counts)} == {cell_len(lines[0][:m.end(2)])
                                                                             for m in counts[:1]}, result.stdout


def test_a_study_name_this_terminal_cannot_encode_is_shown_escaped_not_a_traceback(tmp_path, shared):
    """Under LC_ALL=C or PYTHONIOENCODING=ascii, an emoji study name ended `nas studies` in a UnicodeEncodeError
    traceback; standard output now escapes what it cannot encode, as Python does on standard error."""
    optuna.create_study(storage=shared, study_name="\U0001f642\u00e9")
    done = subprocess.run([*NAS, "studies", "--storage", shared], env={**nas_env(), "PYTHONIOENCODING": "ascii"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert any(line.startswith("\\U0001f642\\xe9 ") for line in done.stdout.splitlines()), done.stdout


def set_stored_attr(storage: str, number: int, name: str, value: object = None, delete: bool = False) -> None:
    """Edit one trial's user attr in the database, as a person with sqlite3 (or another tool) would."""
    with sqlite3.connect(storage.removeprefix("sqlite:///")) as db:
        (trial_id,) = db.execute("SELECT trial_id FROM trials WHERE number = ?", (number,)).fetchone()
        if delete:
            db.execute("DELETE FROM trial_user_attributes WHERE trial_id = ? AND key = ?", (trial_id, name))
        else:
            db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = ?",
                       (json.dumps(value), trial_id, name))


def test_unreadable_trials_are_skipped_with_one_warning_each_and_the_rest_is_written(tmp_path, shared):
    set_stored_attr(shared, 3, "val_loss", "2.9")
    set_stored_attr(shared, 5, "heads", delete=True)
    set_stored_attr(shared, 7, "eval_curve", {"tokens": 8})
    report = tmp_path / "r.html"
    outputs = {name: invoke(*args, "--storage", shared, "--study-name", "prism")
               for name, args in (("best", ["best"]), ("export", ["export"]),
                                  ("report", ["report", "--plotlyjs", "cdn", "-o", str(report)]))}
    for name, result in outputs.items():
        assert result.exit_code == 0, (name, result.output)
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warnings) == 3, (name, result.stderr)
        assert "trial #3" in warnings[0] and "'val_loss'" in warnings[0] and "not a number" in warnings[0]
        assert "trial #5" in warnings[1] and "'heads'" in warnings[1] and "missing" in warnings[1]
        assert "trial #7" in warnings[2] and "'eval_curve'" in warnings[2]
    rows = json.loads(outputs["export"].stdout)
    assert rows and all(3 not in map(int, r["trials"].split(",")) for r in rows)
    html = report.read_text()
    assert "trial #5 skipped" in html and "Leaderboard" in html
