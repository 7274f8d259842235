"""Fuzzed input (hypothesis): every bad command line or shape file ends in one line and exit code 2, writing nothing.

Each generated input starts from a valid command and breaks one or two of its options with a
value of the wrong type, negative, zero, huge, non-dividing, unicode, empty or NaN; shape files
(``nas train --config``, ``nas space show --config``) are random JSON or valid shapes with one field
broken. ``INPUTS_TRIED`` counts them (the README quotes it). Nothing is trained and no storage
is created or changed: the default storage must not appear, an existing one keeps its bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import optuna
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
from nas.arch import uniform
from nas.cli import app

pytestmark = pytest.mark.slow

INPUTS_TRIED = {"count": 0}
FUZZ = settings(max_examples=130, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

WEIRD = ["", " ", "nan", "NaN", "inf", "-inf", "1e400", "abc", "☃", "٣", "0x10", "1,2", "--", "\t", "null", "🙂" * 3]
NEG_ZERO = ["0", "-1", "-7", "-0.5"]
HUGE = ["99999999999999999999", "1e30", str(2**64)]


def bad_count() -> st.SearchStrategy[str]:
    """What is never a count of layers, heads, trials, workers ..."""
    return st.sampled_from(NEG_ZERO + HUGE + WEIRD + ["3.5", "1e3.5"])


def bad_size() -> st.SearchStrategy[str]:
    return st.sampled_from(NEG_ZERO + WEIRD + ["lots", "1e400", "12Q", "5 M B", "1e20", "-5M", "0k"])


def bad_choice() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(WEIRD + ["PRISM", "prism ", "tpe2", "xml"]),
                     st.text(min_size=1, max_size=12).filter(lambda s: s.strip() not in ("", "--")))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz")
    config = path / "arch.json"
    config.write_text(uniform(4, 32, 4, 256).to_json())
    storage = f"sqlite:///{path / 'study.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=4), storage=storage, name="tiny")
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def check_usage_error(workdir: Path, args: list[str]) -> None:
    """One line on stderr starting with error:, exit code 2, no traceback, nothing written."""
    INPUTS_TRIED["count"] += 1
    before = digest(workdir / "study.db")
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert result.exit_code == 2, (args, result.output[-2000:])
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert "Traceback" not in result.output
    assert not (workdir / "nas.db").exists(), args  # the default storage was not created
    assert digest(workdir / "study.db") == before, args  # an existing storage is untouched
    leftovers = {p.name for p in workdir.iterdir()} - {"arch.json", "study.db", "bad.json"}  # no -wal, no -shm
    assert not leftovers, (args, leftovers)


def broken(options: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[list[str]]:
    """One or two of ``options`` with bad values, as command-line arguments."""
    names = sorted(options)
    return st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True).flatmap(
        lambda chosen: st.tuples(*(options[n] for n in chosen)).map(
            lambda values: [part for n, v in zip(chosen, values) for part in (n, v)]))


SPACE_OPTIONS = {
    "--layers": bad_count(), "--d-model": st.one_of(bad_count(), st.sampled_from(["7", "97", "13"])),
    "--heads": st.one_of(bad_count(), st.sampled_from(["7", "5", "11", "97"])),
    "--vocab": bad_count(), "--min-plateau": st.sampled_from(NEG_ZERO + WEIRD + ["5", "9"]),
    "--max-plateau": st.sampled_from(NEG_ZERO + WEIRD + ["1"]), "--min-baseline": st.sampled_from(NEG_ZERO + ["99"]),
    "--min-head-dim": st.sampled_from(NEG_ZERO + WEIRD), "--space": bad_choice(),
}
HOURGLASS_OPTIONS = {
    "--budget": bad_size(), "--k-values": st.sampled_from(["", "0", "1,x", "-2", "1,,2", "nan", "99999", "1.5"]),
    "--layer-values": st.sampled_from(["", "0", "x", "-4", "1e9", "5000"]),
    "--ratio-values": st.sampled_from(["", "0", "-0.4", "nan", "inf", "x", "1e9"]),
    "--tolerance": st.sampled_from(["abc", "-1", "2", "nan", "150%", "0", "inf"]),
    "--ratio-tolerance": st.sampled_from(["abc", "-1", "1", "nan", "0%"]), "--fix": bad_choice(),
    "--head-dim": st.sampled_from(NEG_ZERO + ["5", "7"] + WEIRD), "--hidden-multiple": bad_count(),
}


@FUZZ
@given(command=st.sampled_from(["count", "list"]), args=broken(SPACE_OPTIONS))
def test_nas_space_with_bad_shape_options(workdir, command, args):
    check_usage_error(workdir, ["space", command, *args])


@FUZZ
@given(args=broken(HOURGLASS_OPTIONS))
def test_nas_space_with_bad_hourglass_options(workdir, args):
    check_usage_error(workdir, ["space", "count", "--space", "hourglass", *args])


KV_OPTIONS = {  # grouped-query attention: each value is wrong whatever comes with it
    "--kv-groups": st.sampled_from(["", "0", "5", "24", "x", "-2", "2,,4", "1", "1.5", "☃", "99999"]),
    "--min-kv-heads": st.sampled_from(NEG_ZERO + ["13"] + WEIRD),
    "--kv-min-plateau": st.sampled_from(NEG_ZERO + WEIRD), "--kv-max-plateau": st.sampled_from(NEG_ZERO + WEIRD),
}


@FUZZ
@given(space=st.sampled_from(["prism", "hourglass", "joint"]), args=broken(KV_OPTIONS),
       mode=st.sampled_from([[], ["--kv-schedule"]]))
def test_nas_space_with_bad_grouped_query_options(workdir, space, args, mode):
    check_usage_error(workdir, ["space", "count", "--space", space, *mode, *args])


SEARCH_OPTIONS = {
    "--trials": bad_count(), "--workers": st.sampled_from(NEG_ZERO + HUGE + WEIRD + ["257"]),
    "--threads": st.sampled_from(["-1", "-9", "5000"] + HUGE + WEIRD), "--tokens": bad_size(),
    "--seq-len": bad_count(), "--batch-size": st.one_of(bad_count(), st.just("60000")),
    "--lr": st.sampled_from(NEG_ZERO + WEIRD), "--seed": st.sampled_from(["-1", str(2**40)] + WEIRD),
    "--device": st.sampled_from(["tpu", "cuda", "cuda:7", "mps", "gpu0", "☃"]), "--dtype": bad_choice(),
    "--sampler": bad_choice(), "--pruner": bad_choice(), "--replicates": bad_choice(),
    "--objectives": st.sampled_from(["", "params", "loss,loss", "loss,flops", "tokens_per_s", "☃"]),
    "--heartbeat": st.sampled_from(NEG_ZERO + WEIRD + ["100000"]), "--race-size": bad_count(),
    "--replicate-top": bad_count(), "--preset": bad_choice(),
    "--storage": st.sampled_from(["not a url", "sqlite://", "sqlite:////no/such/folder/x.db", "mysql://u@h/d",
                                  "☃://x", "postgresql://user:pw@127.0.0.1:1/db"]),
    "--study-name": st.sampled_from(["", " ", "x" * 600, "bad\x00name", "tab\tname", "\x1b[31mred"]),
    "--data": st.sampled_from(["/no/such/data", "", "  ", "missing/*.bin", "☃"]),
}


@FUZZ
@given(args=broken({**SEARCH_OPTIONS, **SPACE_OPTIONS}))
def test_nas_search_with_bad_options(workdir, args):
    check_usage_error(workdir, ["search", "--preset", "tiny", *args] if "--preset" not in args else ["search", *args])


READ_OPTIONS = {
    "--study-name": st.sampled_from(["nope", "☃", "x" * 300, ""]), "--top": st.sampled_from(NEG_ZERO + WEIRD),
    "--storage": st.sampled_from(["not a url", "sqlite://", "sqlite:///missing.db", "mysql://u@h/d"]),
}


@FUZZ
@given(command=st.sampled_from(["best", "report", "export"]), args=broken(READ_OPTIONS),
       extra=st.sampled_from([[], ["--format", "xml"], ["-o", "."], ["-o", "no/such/dir/x"], ["--plotlyjs", "svg"]]))
def test_nas_best_report_export_with_bad_options(workdir, command, args, extra):
    storage = ["--storage", f"sqlite:///{workdir / 'study.db'}"] if "--storage" not in args else []
    if extra and ((extra[0] == "--format") != (command == "best") or (extra[0] == "--plotlyjs") != (command ==
                                                                                                   "report")):
        extra = []
    check_usage_error(workdir, [command, *storage, *args, *extra])


RERUN_OPTIONS = {
    "--top": st.sampled_from(NEG_ZERO + WEIRD), "--seeds": st.sampled_from(NEG_ZERO + WEIRD),
    "--nproc": st.sampled_from(NEG_ZERO + ["3", "5"] + WEIRD), "--preset": bad_choice(), "--tokens": bad_size(),
    "--data": st.sampled_from(["/no/such/data", ""]), "--device": st.sampled_from(["tpu", "cuda", "cuda:3"]),
    "--micro-batch": st.sampled_from(["-1"] + WEIRD), "--checkpoint-every": st.sampled_from(["-1"] + WEIRD),
    "--threads": st.sampled_from(["-1"] + WEIRD), "--study-name": st.sampled_from(["nope", "☃", ""]),
}


@FUZZ
@given(args=broken(RERUN_OPTIONS))
def test_nas_rerun_with_bad_options(workdir, args):
    base = ["rerun", "--storage", f"sqlite:///{workdir / 'study.db'}", "--runs", str(workdir / "runs")]
    check_usage_error(workdir, [*base, *args] if "--preset" in args else [*base, "--preset", "tiny", *args])


TRAIN_OPTIONS = {
    "--rank": st.sampled_from(NEG_ZERO + ["2"] + WEIRD), "--preset": bad_choice(), "--tokens": bad_size(),
    "--seed": st.sampled_from(["-1", str(2**40)] + WEIRD), "--device": st.sampled_from(["tpu", "cuda", "cuda:1"]),
    "--data": st.sampled_from(["/no/such/data", ""]), "--checkpoint-every": st.sampled_from(["-1"] + WEIRD),
    "--micro-batch": st.sampled_from(["-1", "3"] + WEIRD), "--threads": st.sampled_from(["-1", "9999"] + WEIRD),
    "--out": st.sampled_from(["arch.json", "/proc/nope"]),
}


@FUZZ
@given(args=broken(TRAIN_OPTIONS))
def test_nas_train_with_bad_options(workdir, args):
    base = ["train", "--config", str(workdir / "arch.json"), "--tokens", "256"]
    if "--preset" not in args:
        base += ["--preset", "tiny"]
    check_usage_error(workdir, [*base, *args])


VALID = json.loads(uniform(4, 32, 4, 256).to_json())
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4), max_leaves=12)
BROKEN_FIELDS = {
    "n_layers": st.sampled_from([0, -1, 10**9, "4", None, 4.0, True, [4]]),
    "d_model": st.sampled_from([0, -32, 7, 2**40, "32", None, 32.5, False]),
    "heads": st.sampled_from([[4, 4, 4], [3, 3, 4, 4], [4, 4, 4, 0], "4,4,4,4", None, [4.0] * 4, [True] * 4, []]),
    "ffn": st.sampled_from([{"k": 0, "hidden": 88}, {"k": 1, "hidden": -1}, {"k": "1", "hidden": 88}, [], "x",
                            {"k": 1}, {"k": 1, "hidden": 10**9}, {"k": 1, "hidden": 88, "wider": 99}, None]),
    "vocab_size": st.sampled_from([0, -256, 2**40, "256", None, 25.6]),
    "tie_embeddings": st.sampled_from(["yes", 1, None, [True]]),
    "rope_theta": st.sampled_from([0, -1, "x", None, 1e400]), "norm_eps": st.sampled_from([0, -1e-5, "x", None]),
}


def broken_shape() -> st.SearchStrategy[str]:
    field = st.sampled_from(sorted(BROKEN_FIELDS)).flatmap(
        lambda name: BROKEN_FIELDS[name].map(lambda value: json.dumps({**VALID, name: value})))
    missing = st.sampled_from(["n_layers", "d_model", "heads", "ffn", "vocab_size"]).map(
        lambda name: json.dumps({k: v for k, v in VALID.items() if k != name}))
    extra = st.text(min_size=1, max_size=6).filter(lambda k: k not in VALID).map(
        lambda key: json.dumps({**VALID, key: 1}))
    rows = st.sampled_from([json.dumps([]), json.dumps([{"rank": 1, "arch": [1]}]), json.dumps({"arch": "x"}),
                            json.dumps([1, 2]), "[NaN]", '{"n_layers": NaN}', "", "{", "\x00", "☃", "nul\x00l"])
    noise = JSON_VALUES.filter(lambda v: not isinstance(v, dict) or set(v) != set(VALID)).map(json.dumps)
    return st.one_of(field, missing, extra, rows, noise)


@FUZZ
@given(text=broken_shape(), command=st.sampled_from(["train", "space"]))
def test_shape_files_that_are_no_shape(workdir, text, command):
    path = workdir / "bad.json"
    path.write_text(text, encoding="utf-8")
    args = (["train", "--config", str(path), "--preset", "tiny", "--tokens", "256"] if command == "train"
            else ["space", "show", "--config", str(path), "--layers", "4", "--d-model", "32", "--heads", "4"])
    check_usage_error(workdir, args)


# ----------------------------------------------------------------- studies in the storage, not only command lines
STORED = settings(FUZZ, max_examples=20)
BROKEN_ATTRS = {
    "val_loss": ["2.9", [], {"x": 1}, True], "heads": ["4,4,4,4", [0, 4, 4, 4], [], [4.5] * 4, "x", {"4": 4}],
    "seed": ["0", -1, 1.5, None, [0]], "key": [3, [], {"k": 1}], "role": [3, ["member"]],
    "arch": [{"x": 1}, "x", [], {"n_layers": 0}], "eval_curve": [{"a": 1}, "x", [[1]], [["a", 1]]],
    "attention_distance": ["x", [None], {}], "duplicate_of": [-1, 10**6, "3", None], "tokens_per_s": ["fast"],
    "params": ["1M"], "status": [0, ["ok"]],
}
READERS = [["best"], ["best", "--format", "json"], ["export"], ["report", "--plotlyjs", "cdn"]]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A shape search of 12 trials and an ordinary Optuna study side by side, in one file that each example copies."""
    path = tmp_path_factory.mktemp("stored") / "pristine.db"
    synthetic_study(SyntheticSpec(space="prism", preset="tiny", trials=12), storage=f"sqlite:///{path}",
                    name="shapes")
    sweep = optuna.create_study(storage=f"sqlite:///{path}", study_name="sweep")
    sweep.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2, n_trials=3)
    return path


def edited_copy(pristine: Path, folder: Path, sql: str, args: tuple) -> str:
    folder.mkdir(exist_ok=True)
    copy = folder / "edited.db"
    copy.write_bytes(pristine.read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute(sql, args)
    return f"sqlite:///{copy}"


def read_back(storage: str, folder: Path, reader: list[str], study: str):
    INPUTS_TRIED["count"] += 1
    out = ["-o", str(folder / "r.html")] if reader[0] == "report" else []
    result = CliRunner().invoke(app, [*reader, "--storage", storage, "--study-name", study, *out])
    assert result.exception is None or isinstance(result.exception, SystemExit), (reader, result.exception)
    assert "Traceback" not in result.output, result.output[-2000:]
    return result


@STORED
@given(number=st.integers(0, 11), name=st.sampled_from(sorted(BROKEN_ATTRS)), data=st.data(),
       reader=st.sampled_from(READERS))
def test_a_trial_with_an_unreadable_attribute_is_skipped_with_one_warning(pristine, tmp_path_factory, number, name,
                                                                         data, reader):
    value = data.draw(st.sampled_from(BROKEN_ATTRS[name]))
    folder = tmp_path_factory.getbasetemp() / "stored-edits"
    storage = edited_copy(pristine, folder, "INSERT OR REPLACE INTO trial_user_attributes (trial_id, key, value_json) "
                          "SELECT trial_id, ?, ? FROM trials WHERE number = ? AND study_id = 1",
                          (name, json.dumps(value), number))
    result = read_back(storage, folder, reader, "shapes")
    assert result.exit_code == 0, (name, value, result.output[-2000:])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"trial #{number} " in warnings[0] and repr(name) in warnings[0], result.stderr
    if reader[0] == "report":
        assert (folder / "r.html").stat().st_size > 0


@STORED
@given(number=st.integers(0, 11), name=st.sampled_from(["key", "heads", "arch", "seed", "val_loss"]),
       reader=st.sampled_from(READERS))
def test_a_trial_missing_an_attribute_is_read_or_skipped_never_a_crash(pristine, tmp_path_factory, number, name,
                                                                      reader):
    folder = tmp_path_factory.getbasetemp() / "stored-deletes"
    storage = edited_copy(pristine, folder, "DELETE FROM trial_user_attributes WHERE key = ? AND trial_id = "
                          "(SELECT trial_id FROM trials WHERE number = ? AND study_id = 1)", (name, number))
    result = read_back(storage, folder, reader, "shapes")
    assert result.exit_code == 0, (name, result.output[-2000:])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) <= 1 and all(f"trial #{number} " in w and repr(name) in w for w in warnings), result.stderr


@STORED
@given(attr=st.sampled_from(["nas:identity", "nas:baseline_key"]), value=JSON_VALUES, reader=st.sampled_from(READERS))
def test_a_study_that_is_no_shape_search_is_refused_in_one_line(pristine, tmp_path_factory, attr, value, reader):
    folder = tmp_path_factory.getbasetemp() / "stored-studies"
    if attr == "nas:identity" and isinstance(value, dict):
        value = {**value, "space": "not a description"}
    if attr == "nas:baseline_key" and isinstance(value, str):
        value = [value]
    storage = edited_copy(pristine, folder, "UPDATE study_user_attributes SET value_json = ? WHERE key = ?",
                          (json.dumps(value), attr))
    for study in ("sweep", "shapes"):  # another tool's study; a shape search whose description was overwritten
        result = read_back(storage, folder, reader, study)
        lines = result.stderr.splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "is not a shape search" in lines[0], result.output


def test_at_least_a_thousand_inputs_were_tried():
    """Runs last in this module (pytest keeps file order): the count the README quotes."""
    assert INPUTS_TRIED["count"] >= 1000, INPUTS_TRIED
