"""``nas search`` and ``nas best`` on the command line: one-line usage errors, the leaderboard, several objectives."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from statistics import mean
from types import SimpleNamespace

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import TrialState
from search_helpers import TINY, assert_no_repeated_work, counted, load_trials, run_nas, sqlite_url
from typer.testing import CliRunner

from nas.arch import uniform
from nas.cli import app
from nas.cli.progress import Progress
from nas.study.config import SearchConfig
from nas.study.session import make_sampler
from nas.study.worker import TrialEvent, summary
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def one_line_error(result) -> str:
    """The whole of stderr: one line, starting with ``error:``."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("args, says", [
    (["--space", "pyramid"], "'pyramid' is not one of 'prism', 'hourglass', 'joint'"),
    (["--storage", "not a url"], "storage URL 'not a url' is malformed"),
    (["--storage", "sqlite://"], "names no file"),
    (["--storage", "sqlite:////no/such/folder/nas.db"], "does not exist"),
    (["--storage", "postgresql://nas@127.0.0.1:1/nas"], "cannot open storage"),  # nothing listens on port 1
    (["--storage", "postgresql+asyncpg://nas@127.0.0.1/nas"], "needs the Python package 'asyncpg': install it, or "
     "write the URL as postgresql://... (the driver psycopg2"),  # the postgres extra installs psycopg2, not asyncpg
    (["--storage", "mysql://nas@127.0.0.1/nas"], "needs the Python package 'MySQLdb': install that driver"),  # not
    # installed; the hint no longer offers PostgreSQL's extra for it
    (["--trials", "0"], "--trials 0 is invalid"),
    (["--trials", "-3"], "--trials -3 is invalid"),
    (["--workers", "0"], "--workers 0 is invalid"),
    (["--sampler", "cmaes"], "'cmaes' is not one of 'tpe', 'random', 'grid', 'gp', 'nsga2'"),
    (["--pruner", "asha"], "'asha' is not one of 'auto', 'median', 'hyperband', 'none'"),
    (["--dtype", "fp8"], "'fp8' is not one of 'fp32', 'bf16'"),
    (["--trials", "many"], "Invalid value for '--trials' ('many')"),
    (["--trials", "2", "--trials", "many"], "Invalid value for '--trials' ('many')"),  # the value refused, the last
    (["--no-such-option"], "No such option: --no-such-option"),
    (["--objectives", "loss,flops"], "--objectives 'loss,flops' is invalid"),
    (["--objectives", "params"], "--objectives 'params' is invalid"),
    (["--objectives", "loss,params", "--sampler", "gp"], "--sampler gp takes a single objective"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--tokens", "lots"], "--tokens"),
    (["--heartbeat", "0"], "--heartbeat 0 is invalid"),
    (["--threads", "-2"], "threads=-2 is invalid"),
    (["--heads", "0"], "0 heads is not a head count: give at least 1 (d_model=32: divisors ≤ 8 are 1,2,4,8)"),
    # below the data's 256 byte ids: refused before the study is made (it was made, and each worker failed on it)
    (["--vocab", "100"], "vocab_size=100 is smaller than the data's vocabulary 256; give at least 256"),
    # a space of the baseline alone: refused (the search's planner raised a traceback, leaving the baseline WAITING)
    (["--layers", "1"], "the prism space of these options holds only the baseline: no shape to compare it with"),
    (["--space", "hourglass", "--k-values", "1000"], "the hourglass space of these options holds only the baseline"),
])
def test_search_with_a_bad_option_value_prints_one_line_and_exits_2(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    result = invoke("search", *TINY, *args)
    assert result.exit_code == 2, result.output
    assert says in one_line_error(result)
    if "--storage" not in args:
        assert not (tmp_path / "nas.db").exists()  # checked before anything is stored


def test_bad_option_exit_status_is_2_from_the_real_command(tmp_path):
    proc = run_nas("search", "--trials", "0", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "error: --trials 0 is invalid: give at least 1\n"
    assert not (tmp_path / "nas.db").exists()


@pytest.mark.parametrize("args", [["--trials", "0"], ["--space", "pyramid"], ["--tokens", "lots"], ["--heads", "7"],
                                  ["--preset", "huge"], ["--lr", "-1"]])
def test_bad_search_options_are_reported_before_torch_is_imported(args):
    """A typo is answered in about a second: importing torch (the study, the model) takes ~4 s."""
    code = ("import sys; from typer.testing import CliRunner; from nas.cli import app; "
            f"r = CliRunner().invoke(app, ['search', *{args!r}]); print(r.exit_code, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr


def resolved_study_name(space: SpaceOptions, preset: str = "tiny", *overrides, data: str = "builtin") -> str:
    """The name `nas search` gives the study of these options (as ``open_search`` resolves it)."""
    from nas.data import load_data
    from nas.study.identity import study_name, train_config
    from runners.presets import get_preset
    from search_spaces.factory import build_space

    config = SearchConfig(space=space, preset=preset, data=data, train_overrides=tuple(overrides))
    loaded = load_data(data)
    built = build_space(config.space, defaults=get_preset(preset).baseline.replace(vocab_size=loaded.vocab_size))
    return study_name(config, built, train_config(config), loaded)


def test_run_only_options_keep_the_default_study_name_and_training_changes_add_a_hash():
    prism = SpaceOptions(space="prism")
    assert resolved_study_name(prism) == "prism-tiny"
    # how, not what, it trains
    assert resolved_study_name(prism, "tiny", ("threads", 1), ("device", "cpu"), ("compile", False)) == "prism-tiny"
    assert resolved_study_name(prism, "tiny", ("tokens", get_preset("tiny").train.tokens)) == "prism-tiny"
    changed = resolved_study_name(prism, "tiny", ("tokens", 8192))
    assert changed.startswith("prism-tiny-") and changed != resolved_study_name(prism, "tiny", ("lr", 0.5))


def test_options_typed_with_their_default_values_keep_the_default_study_name():
    """Identity comes from the resolved values: `nas search --layers 12 --heads 12` continues study prism-cpu."""
    assert resolved_study_name(SpaceOptions(space="prism", layers=12, heads=12), "cpu") == "prism-cpu"
    assert resolved_study_name(SpaceOptions(space="prism", d_model=96, min_plateau=2, max_plateau=4,
                                            min_baseline=6, vocab=256), "cpu") == "prism-cpu"
    assert resolved_study_name(SpaceOptions(space="hourglass", k_values=(1, 2, 4, 6, 8)), "cpu") == "hourglass-cpu"
    assert resolved_study_name(SpaceOptions(space="prism"), "cpu", ("seed", 0), ("lr", 1e-2)) == "prism-cpu"
    assert resolved_study_name(SpaceOptions(space="prism", layers=6), "cpu").startswith("prism-cpu-")


# ----------------------------------------------------------------- nas best
@pytest.fixture(scope="module")
def small_study(tmp_path_factory, tiny_study_file):
    """A space of 3 searched with 4 trials: every member once, then a second seed of the baseline (the session's
    tiny study, a copy of this module's own)."""
    from tests.search_helpers import copy_study

    storage = copy_study(tiny_study_file, tmp_path_factory.mktemp("best") / "best.db")
    return storage, "proxy", load_trials(storage, "proxy")


@pytest.mark.slow
def test_best_json_gives_mean_and_ci_over_seeds_and_gain_over_the_baseline(small_study):
    storage, name, trials = small_study
    result = invoke("best", "--study-name", name, "--storage", storage, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 3 and [r["rank"] for r in rows] == [1, 2, 3]
    assert [r["adjusted_loss"] for r in rows] == sorted(r["adjusted_loss"] for r in rows)
    (base,) = [r for r in rows if r["is_baseline"]]
    base_losses = [t.values[0] for t in counted(trials) if t.user_attrs["key"] == trials[0].user_attrs["key"]]
    assert base["seeds"] == 2 and base["mean_loss"] == pytest.approx(mean(base_losses))
    assert base["ci95"] > 0 and base["gain_pct"] == 0 and base["heads"] == "4x4"
    assert '"-0.0' not in result.stdout  # the baseline's gains over itself are 0.0 (they printed as -0.0)
    assert sum(r["is_answer_pick"] for r in rows) == 1  # the answer's shape, marked (a race's need not rank first)
    for r in rows:
        assert r["params"] > 0 and r["tokens_per_s"] > 0 and r["k"] == 1 and r["layers"] == 4
        assert r["gain_pct"] == pytest.approx(100 * (base["mean_loss"] - r["adjusted_loss"]) / base["mean_loss"])
        if not r["is_baseline"]:
            assert r["seeds"] == 1 and r["ci95"] is None  # one seed: no interval
            # on the baseline's mean: its own loss less the baseline's loss on the same seed (seed 0)
            assert r["adjusted_loss"] == pytest.approx(base["mean_loss"] + r["mean_loss"] - base_losses[0])
    top1 = json.loads(invoke("best", "--study-name", name, "--storage", storage, "--top", "1",
                             "--format", "json").stdout)
    assert top1[0]["rank"] == 1 and any(r["is_baseline"] for r in top1) and len(top1) == (1 if rows[0]["is_baseline"]
                                                                                          else 2)


@pytest.mark.slow
def test_best_table_lists_every_shape_and_marks_the_baseline(small_study):
    storage, name, _ = small_study
    result = invoke("best", "--study-name", name, "--storage", storage)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank "))
    sentence, header, *rows, legend = lines[0], *lines[start:]
    assert legend.startswith("* the answer's interval: ")
    assert "the baseline" in sentence  # the summary sentence first, as the report says it
    for column in ("heads", "seeds", "expected gain % [95%]*", "paired gain % [95% CI]", "on base seeds", "tied",
                   "params", "tok/s"):
        assert column in header
    assert len(rows) == 3 and sum(row.endswith("(baseline)") for row in rows) == 1
    # one study in the storage: --study-name may be left out
    assert invoke("best", "--storage", storage).stdout == result.stdout


@pytest.mark.slow
def test_a_best_json_row_is_a_valid_train_config(small_study, tmp_path):
    """`nas best --format json > best.json; nas train --config best.json [--rank N]` trains that shape."""
    storage, name, _ = small_study
    board = invoke("best", "--study-name", name, "--storage", storage, "--format", "json").stdout
    (tmp_path / "best.json").write_text(board)
    rows = json.loads(board)
    for rank in (1, 3):
        out = tmp_path / f"rank{rank}.json"
        result = invoke("train", "--config", str(tmp_path / "best.json"), "--rank", str(rank), "--preset", "tiny",
                        "--tokens", "1024", "-o", str(out))
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text())["arch"] == rows[rank - 1]["arch"]
    (tmp_path / "row.json").write_text(json.dumps(rows[1]))  # one row on its own
    result = invoke("train", "--config", str(tmp_path / "row.json"), "--preset", "tiny", "--tokens", "1024")
    assert result.exit_code == 0 and json.loads(result.stdout)["arch"] == rows[1]["arch"]


def test_best_with_a_bad_study_or_format_is_one_line_and_exit_2(tmp_path):
    storage = sqlite_url(tmp_path / "empty.db")
    optuna.create_study(storage=storage, study_name="other")
    result = invoke("best", "--study-name", "nope", "--storage", storage)
    assert result.exit_code == 2 and "no study 'nope'" in one_line_error(result) and "other" in result.stderr
    result = invoke("best", "--study-name", "other", "--storage", storage, "--format", "xml")
    assert result.exit_code == 2 and "'xml' is not one of 'table', 'json'" in one_line_error(result)


# ----------------------------------------------------------------- several objectives
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_several_objectives_default_to_nsga2_and_no_pruning():
    several = SearchConfig(objectives=("loss", "params"))
    assert isinstance(make_sampler(several, seed=0), optuna.samplers.NSGAIISampler)
    assert isinstance(make_sampler(SearchConfig(), seed=0), optuna.samplers.TPESampler)


@pytest.mark.slow
def test_objectives_loss_params_gives_a_two_objective_study_with_a_pareto_front(tmp_path, one_thread):
    # the hourglass grid: members' parameter counts differ (within the budget tolerance), so loss against params is
    # a real trade-off (every Prism schedule of a shape has the same count, which would make a front of one point)
    storage = sqlite_url(tmp_path / "pareto.db")
    result = invoke("search", "--space", "hourglass", *TINY, "--tokens", "2048", "--trials", "5",
                    "--objectives", "loss,params", "--storage", storage)
    assert result.exit_code == 0, result.output
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    study = optuna.load_study(study_name=name, storage=storage)
    assert study.directions == [StudyDirection.MINIMIZE, StudyDirection.MINIMIZE]
    trials = study.get_trials(deepcopy=False)
    assert_no_repeated_work(trials, 5)
    done = counted(trials)
    assert all(t.state == TrialState.COMPLETE for t in done)  # Optuna prunes single-objective studies only
    assert len({t.values[1] for t in done}) > 1  # shapes of different sizes
    for t in done:
        assert t.values == [t.user_attrs["val_loss"], float(t.user_attrs["params"])]
    front = study.best_trials
    assert front and all(len(t.values) == 2 for t in front)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for f in front:  # nothing dominates a trial on the front
        assert not any(all(a <= b for a, b in zip(t.values, f.values)) and t.values != f.values for t in complete)
    for t in complete:  # and every trial off the front is dominated by one on it
        if t.number not in {f.number for f in front}:
            assert any(all(a <= b for a, b in zip(f.values, t.values)) for f in front)


# ----------------------------------------------------------------- the progress line
def test_progress_compares_the_best_shapes_mean_over_seeds_with_the_baselines_mean():
    baseline = uniform(4, 32, 4, 256)
    other = "L4-d32-h[2,2,4,4]-other"

    def trained(number: int, key: str, seed: int, loss: float, **attrs) -> optuna.trial.FrozenTrial:
        t = optuna.trial.create_trial(value=loss, user_attrs={"key": key, "seed": seed, "status": "ok",
                                                              "val_loss": loss, **attrs})
        t.number = number
        return t

    trials = [trained(0, baseline.key(), 0, 3.40), trained(1, other, 0, 3.42), trained(2, baseline.key(), 1, 3.50),
              trained(3, other, 1, 3.44), trained(4, baseline.key(), 0, 3.40, duplicate_of=0)]
    counted_trials, best, base = summary(SimpleNamespace(baseline=baseline), trials)
    # the baseline's lucky first seed (3.40) is not the best, nor a gain over the baseline itself
    assert counted_trials == 4 and best == (1, pytest.approx(3.43)) and base == pytest.approx(3.45)

    stream = io.StringIO()
    Progress(stream=stream)(TrialEvent(3, "replicate", baseline, 1, "complete", 3.44, 1.5, counted_trials, 10, best,
                                       base))
    line = stream.getvalue()
    assert line.startswith("[ 4/10] #3 replicate h=4x4 ") and "loss 3.4400 (complete, 1.5s)" in line
    assert "| best 3.4300 #1 (+0.58% vs baseline 3.4500)" in line and "| ETA " in line


def test_progress_estimates_the_time_left_from_the_trainings_after_each_workers_first_then_once_only():
    """The estimate is the median training of the four after each worker's first (its one-off start: imports, first
    touch of memory), shared by the workers: here 2 workers whose first trainings took 8 s, then 5.0, 5.2, 9.0 (one
    slow: a mean would say 6.05) and 4.8 s, so 5.1 s a trial each, 2.55 s for both; duplicates and trainings after
    the estimate do not count."""
    baseline = uniform(4, 32, 4, 256)
    stream = io.StringIO()
    progress = Progress(workers=2, stream=stream, clock=iter(range(100)).__next__)
    events = [("complete", 8.0), ("complete", 8.0), ("duplicate", 0.1), ("complete", 5.0), ("complete", 5.2),
              ("pruned", 9.0), ("complete", 4.8), ("complete", 1.0), ("complete", 1.0)]
    for i, (state, wall) in enumerate(events):
        progress(TrialEvent(i, "member", baseline, 0, state, 3.4, wall, i + 1, 20, None, None))
    estimates = [line for line in stream.getvalue().splitlines() if line.startswith("estimate: ")]
    # printed after the 7th event: 13 trials left at 2.55 s
    assert estimates == ["estimate: a trial every 2.5 s (the median of this run's trainings 3-6 on this machine, "
                         "over 2 workers: each worker's first, with its one-off start, left out): the 13 trials left "
                         "take about 0m33s"]
    single = io.StringIO()
    progress = Progress(workers=1, stream=single, clock=iter(range(100)).__next__)
    for i, wall in enumerate([9.0, 3.0, 3.0, 30.0, 3.2]):
        progress(TrialEvent(i, "member", baseline, 0, "complete", 3.4, wall, i + 1, 10, None, None))
    assert "estimate: a trial every 3.1 s (the median of this run's trainings 2-5 on this machine: each worker's " \
           "first, with its one-off start, left out): the 5 trials left take about 0m15s" in single.getvalue()
    # workers on several devices (a GPU's and a CPU's trainings): the pace of trainings ending, all workers together
    mixed = io.StringIO()
    progress = Progress(workers=2, stream=mixed, clock=iter([0.0, 9.0, 10.0, 10.5, 12.5, 15.0, 17.5, 20.0]).__next__)
    progress.devices = 2
    for i, (state, wall) in enumerate(events[:7]):
        progress(TrialEvent(i, "member", baseline, 0, state, 3.4, wall, i + 1, 20, None, None))
    # trainings 3-6 end at 12.5 .. 20 s: 10 s past the second first training's end at 10 s, 2.5 s a trial
    assert "estimate: a trial every 2.5 s (the time between this run's trainings 3-6 on this machine ending, the 2 " \
           "workers on several devices together: each worker's first, with its one-off start, left out): the 13 " \
           "trials left take about 0m32s" in mixed.getvalue()


def test_a_resumed_search_estimates_the_time_left_from_its_stored_trials_in_its_first_line():
    study = optuna.create_study()
    for wall in (6.0, 8.0, 7.0):
        study.add_trial(optuna.trial.create_trial(value=3.0, user_attrs={"key": "k", "wall_time_s": wall}))
    search = SimpleNamespace(study=study, config=SimpleNamespace(trials=13))
    text = Progress(stream=io.StringIO())._stored_estimate(search)
    assert text == "about 7.0 s a trial (median of the study's 3 stored trials), 1 worker: the 10 trials left take " \
                   "about 1m10s"
    fresh = SimpleNamespace(study=optuna.create_study(), config=SimpleNamespace(trials=13))
    assert Progress(stream=io.StringIO())._stored_estimate(fresh) == \
        "time: estimated after each worker's first training and 4 more on this machine"


def test_the_first_line_says_whether_the_study_is_resumed_and_how_far():
    """The first line said neither: an option mistyped on resume (a new study) read like the resume itself."""
    study = optuna.create_study()
    for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):  # the failure has no result: not counted
        study.add_trial(optuna.trial.create_trial(state=state, value=3.0 if state != TrialState.FAIL else None,
                                                  intermediate_values={1: 3.0}, user_attrs={"key": "k"}))
    assert Progress._resumed_text(SimpleNamespace(study=study)) == ", resumed: 2 trained already"
    assert Progress._resumed_text(SimpleNamespace(study=optuna.create_study())) == ", none trained yet"


def test_the_last_line_says_when_every_trained_trial_failed():
    """Issue 52: a search whose every trial diverged ended "holds 3 trained trials" and an answer's resolution,
    without saying that none has a score."""
    from nas.cli.search import trained_text

    def trial(state: TrialState, status: str) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(state=state, value=2.0 if state == TrialState.COMPLETE else None,
                                         user_attrs={"key": status, "seed": 0, "status": status})

    diverged = [trial(TrialState.FAIL, "diverged") for _ in range(3)]
    assert trained_text(diverged) == ("3 trained trials, all diverged: no shape has a score (a lower --lr may train "
                                      "them)", True)
    assert trained_text([*diverged[:2], trial(TrialState.FAIL, "oom")]) == (
        "3 trained trials, all failed (2 diverged, 1 ran out of memory): no shape has a score", True)
    assert trained_text([*diverged, trial(TrialState.COMPLETE, "ok")]) == (
        "4 trained trials (3 diverged: recorded as failures, not on the board)", False)
    assert trained_text([trial(TrialState.COMPLETE, "ok"), trial(TrialState.PRUNED, "pruned")]) == (
        "2 trained trials", False)
    assert trained_text([]) == ("0 trained trials", False)


def test_the_first_line_names_as_many_racers_as_the_space_holds():
    """A race of "the 8 best" in a space of 5 shapes (the baseline and 4 others) races 4 of them, and says so."""
    from nas.cli.progress import replicates_text

    assert replicates_text("race", 8, 5) == "then a race of the baseline and the 4 best"
    assert replicates_text("race", 3, 129) == "then a race of the baseline and the 3 best"
    assert replicates_text("race", 8, 2) == "then a race of the baseline and the best shape"
    assert replicates_text("fixed", 8, 5) == "then seed replicates"
