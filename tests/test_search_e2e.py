"""``nas search`` end to end: real (tiny) training into SQLite, read back the way a person would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from optuna.trial import TrialState
from search_helpers import SPACE5, TINY, assert_no_repeated_work, counted, load_trials, run_nas, sqlite_url
from typer.testing import CliRunner

from nas.cli import app
from nas.errors import UsageError
from nas.study.config import SearchConfig
from nas.study.parallel import run_search
from nas.study.records import counts
from nas.study.trial import proposal_sampler
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

# what a person looks for in optuna-dashboard, on every trained trial
SHAPE_ATTRS = {"key", "arch", "heads", "k", "d_h", "d_model", "layers", "d_model_per_layer", "d_h_over_d_model",
               "params", "params_attention", "params_ffn", "params_embedding", "seed", "role"}
RESULT_ATTRS = {"status", "reason", "val_loss", "val_ppl", "eval_curve", "params_breakdown", "flops_per_token",
                "tokens_per_s", "wall_time_s", "attention_distance", "peak_memory_mb"}

READ_BACK = """
import json, sys, optuna
study = optuna.load_study(study_name=sys.argv[1], storage=sys.argv[2])
print(json.dumps([[t.number, t.state.name, t.values, t.user_attrs.get("key"), t.user_attrs.get("seed")]
                  for t in study.trials]))
"""


def tiny_space(**shape) -> SpaceOptions:
    return SpaceOptions(space="prism", **shape)


def test_search_trains_the_baseline_first_stores_every_attr_and_never_repeats_a_shape(tmp_path):
    # 5 members > 4 trials: the sampler (TPE) proposes, and may propose a shape again (answered, not trained)
    storage = sqlite_url(tmp_path / "study.db")
    events = []
    search = run_search(SearchConfig(space=tiny_space(layers=6), preset="tiny", storage=storage, trials=4),
                        on_event=events.append)
    assert not search.exhaustive
    name = search.config.study_name
    assert re.fullmatch(r"prism-tiny-[0-9a-f]{6}", name)  # derived: the shape differs from the preset's
    trials = load_trials(storage, name)
    assert_no_repeated_work(trials, 4)

    baseline = trials[0]
    assert baseline.user_attrs["role"] == "baseline" and baseline.state == TrialState.COMPLETE
    assert baseline.user_attrs["heads"] == [4] * 6 and baseline.user_attrs["key"] == search.baseline.key()
    assert baseline.user_attrs["seed"] == search.train.seed
    for t in counted(trials):
        missing = (SHAPE_ATTRS | RESULT_ATTRS) - set(t.user_attrs)
        assert not missing, f"trial {t.number} lacks {sorted(missing)}"
        a = t.user_attrs
        assert (a["status"], a["reason"] is None) in (("ok", True), ("pruned", False))  # median pruner at work
        assert len(a["heads"]) == a["layers"] == 6
        assert len(a["attention_distance"]) == (6 if a["status"] == "ok" else 0)  # measured on finished models
        assert a["params"] == a["params_breakdown"]["total"] == sum(
            a[f"params_{part}"] for part in ("attention", "ffn", "embedding")) + a["params_breakdown"]["norm"]
        assert a["flops_per_token"] > 0 and a["tokens_per_s"] > 0 and a["wall_time_s"] > 0
        # the pruner sees the validation curve as intermediate values, keyed by tokens seen
        assert {int(step): loss for step, loss in a["eval_curve"]} == t.intermediate_values
    for t in trials:
        if "duplicate_of" in t.user_attrs:  # answered from the stored result, not trained
            assert t.values == trials[t.user_attrs["duplicate_of"]].values and "eval_curve" not in t.user_attrs

    assert [e.counted for e in events if e.state in ("complete", "pruned")] == [1, 2, 3, 4]
    assert events[-1].best is not None and events[-1].baseline == pytest.approx(baseline.values[0])

    # a fresh process reads the same study with plain Optuna
    out = subprocess.run([sys.executable, "-c", READ_BACK, name, storage], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert json.loads(out) == [[t.number, t.state.name, t.values, t.user_attrs.get("key"), t.user_attrs.get("seed")]
                               for t in trials]


def test_rerunning_the_same_search_continues_it_to_the_requested_trials(tmp_path):
    config = SearchConfig(space=tiny_space(), preset="tiny", storage=sqlite_url(tmp_path / "s.db"), trials=2)
    first = run_search(config)
    assert sum(counts(t) for t in first.study.trials) == 2
    again = run_search(SearchConfig(**{**config.__dict__, "trials": 4}))
    assert again.config.study_name == first.config.study_name == "prism-tiny"  # preset defaults: no hash
    trials = again.study.trials
    assert_no_repeated_work(trials, 4)
    assert len(run_search(SearchConfig(**{**config.__dict__, "trials": 4})).study.trials) == len(trials)
    # the same study name with other training settings is refused, not mixed in
    other = SearchConfig(**{**config.__dict__, "study_name": "prism-tiny", "train_overrides": (("lr", 0.5),)})
    with pytest.raises(UsageError, match="created with other settings: train.lr is 0.01 there, 0.5 here"):
        run_search(other)


def test_space_of_5_with_12_trials_trains_each_member_once_then_seed_replicates(tmp_path):
    proc = run_nas("search", *SPACE5, *TINY, "--tokens", "2k", "--trials", "12", "--replicates", "fixed", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "nas.db").is_file()  # the default storage, in the working directory
    name = re.search(r"study '([^']+)'", proc.stderr).group(1)
    assert f"--study-name {name}" in proc.stderr.splitlines()[-1]
    assert re.search(r"^\[12/12\] #\d+ .*\| best \d\.\d{4} #\d+ \([+-]\d+\.\d\d% vs baseline", proc.stderr, re.M)

    trials = load_trials(sqlite_url(tmp_path / "nas.db"), name)
    assert_no_repeated_work(trials, 12)
    space = build_space(tiny_space(layers=6), defaults=get_preset("tiny").baseline)
    members = [arch.key() for arch in space]
    assert len(members) == 5
    done = counted(trials)
    first_seed = [t for t in done if t.user_attrs["seed"] == 0]
    assert sorted(t.user_attrs["key"] for t in first_seed) == sorted(members)  # each member once
    assert [t.user_attrs["key"] for t in sorted(first_seed, key=lambda t: t.number)] == members  # in space order
    assert trials[0].user_attrs["role"] == "baseline" and trials[0].user_attrs["key"] == members[0]
    replicates = [t for t in done if t.user_attrs["seed"] != 0]
    assert len(replicates) == 7 and {t.user_attrs["role"] for t in replicates} == {"replicate"}
    seeds = defaultdict(set)
    for t in done:
        seeds[t.user_attrs["key"]].add(t.user_attrs["seed"])
    assert len(seeds[members[0]]) >= 2  # the baseline gets replicates: its CI is what gains are judged by
    # replicates spread over the baseline and the --replicate-top (4) best: every shape gets a second seed first
    assert sorted(len(s) for s in seeds.values()) == [2, 2, 2, 3, 3]

    board = json.loads(CliRunner().invoke(app, ["best", "--study-name", name, "--storage",
                                                sqlite_url(tmp_path / "nas.db"), "--format", "json"]).stdout)
    assert len(board) == 5 and all(row["ci95"] is not None and row["seeds"] >= 2 for row in board)
    assert Counter(row["is_baseline"] for row in board) == {True: 1, False: 4}


def test_space_of_5_races_its_members_on_common_seeds_after_the_walk(tmp_path):
    """--replicates race after an exhaustive walk: the baseline and the best members race on common seeds; the
    worse ones are dropped; every (shape, seed) once; nas best names the tied set."""
    storage = sqlite_url(tmp_path / "race.db")
    search = run_search(SearchConfig(space=tiny_space(layers=6), preset="tiny", storage=storage, trials=20,
                                     replicates="race", race_size=3, train_overrides=(("tokens", 2048),)))
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, 20)
    done = counted(trials)
    first = [t for t in done if t.user_attrs["role"] in ("baseline", "member")]
    assert len(first) == 5 and {t.user_attrs["seed"] for t in first} == {0}
    raced = [t for t in done if t.user_attrs["role"] in ("race", "confirm")]
    assert len(raced) == 15 and 0 not in {t.user_attrs["seed"] for t in raced}
    round_1 = {t.user_attrs["key"] for t in raced if t.user_attrs["seed"] == 1}
    assert len(round_1) == 4 and search.baseline.key() in round_1  # the baseline and the 3 best, one common seed
    assert all(t.state == TrialState.COMPLETE for t in raced)  # race trials are never pruned
    board = json.loads(CliRunner().invoke(app, ["best", "--storage", storage, "--format", "json"]).stdout)
    assert sum(r["tied_with_best"] for r in board) >= 1 and all("paired_gain_low" in r for r in board)


def test_space_of_5_spends_its_replicates_adaptively(tmp_path):
    """--replicates adaptive after an exhaustive walk, real training: the warm-up puts the baseline
    and the first pass's best on seed 1, then every trial goes to a shape's lowest free seed above the base;
    every (shape, seed) once, nothing pruned; the report's pick, its credible interval and tied set come out."""
    storage = sqlite_url(tmp_path / "adaptive.db")
    search = run_search(SearchConfig(space=tiny_space(layers=6), preset="tiny", storage=storage, trials=20,
                                     replicates="adaptive", train_overrides=(("tokens", 2048),)))
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, 20)
    done = counted(trials)
    replicates = [t for t in done if t.user_attrs["role"] not in ("baseline", "member")]
    assert len(replicates) == 15 and {t.user_attrs["role"] for t in replicates} <= {"adaptive", "adaptive-confirm"}
    assert {t.user_attrs["seed"] for t in replicates[:5]} == {1}  # the warm-up: 4 best + the baseline, all 5 here
    for t in replicates:  # common seeds: the lowest seed above the base that the shape had not trained on
        earlier = {u.user_attrs["seed"] for u in done if u.user_attrs["key"] == t.user_attrs["key"]
                   and u.number < t.number}
        assert t.user_attrs["seed"] == min(set(range(1, 30)) - earlier)
    assert all(t.state == TrialState.COMPLETE for t in replicates)  # adaptive trials are never pruned
    board = json.loads(CliRunner().invoke(app, ["best", "--storage", storage, "--format", "json"]).stdout)
    assert sum(r["tied_with_best"] for r in board) >= 1 and all("paired_gain_low" in r for r in board)


def test_a_suggestion_of_a_trained_shape_is_answered_from_the_stored_result(tmp_path):
    config = SearchConfig(space=tiny_space(), preset="tiny", storage=sqlite_url(tmp_path / "dup.db"), trials=1,
                          sampler="random")
    search = run_search(config)  # trains the baseline only
    search.study.enqueue_trial(search.space.params_of(search.baseline))  # as if the sampler proposed it again
    trials = run_search(SearchConfig(**{**config.__dict__, "trials": 2})).study.trials
    repeat = trials[1]
    assert repeat.user_attrs["duplicate_of"] == 0 and repeat.user_attrs["key"] == trials[0].user_attrs["key"]
    assert repeat.state == TrialState.COMPLETE and repeat.values == trials[0].values
    assert not counts(repeat) and "eval_curve" not in repeat.user_attrs  # nothing was trained
    assert_no_repeated_work(trials, 2)


@pytest.mark.parametrize("sampler, pruner, sampler_class, pruner_class", [
    ("tpe", "hyperband", "TPESampler", "HyperbandPruner"),
    ("random", "median", "RandomSampler", "MedianPruner"),
    ("grid", "none", "BruteForceSampler", "NopPruner"),
    ("gp", "median", "GPSampler", "MedianPruner"),
    ("nsga2", "none", "NSGAIISampler", "NopPruner"),
])
def test_every_sampler_and_pruner_searches(tmp_path, sampler, pruner, sampler_class, pruner_class):
    # 5 members > 3 trials: the sampler proposes every trial after the baseline
    search = run_search(SearchConfig(space=tiny_space(layers=6), preset="tiny", storage=sqlite_url(tmp_path / "s.db"),
                                     trials=3, sampler=sampler, pruner=pruner,
                                     train_overrides=(("tokens", 2048),)))
    assert type(search.study.sampler).__name__ == sampler_class and type(search.study.pruner).__name__ == pruner_class
    # and the per-trial sampler that draws each proposal is of the same kind
    assert type(proposal_sampler(search, 7, None)).__name__ == sampler_class
    trials = search.study.trials
    assert_no_repeated_work(trials, 3)
    assert {t.user_attrs["role"] for t in counted(trials)} == {"baseline", "sampled"}


GRID = {"k_values": (1, 2, 8), "layer_values": (2, 4), "ratio_values": (0.5, 1.0)}


@pytest.mark.parametrize("space", ["hourglass", "joint"])
def test_hourglass_and_joint_searches_train_k_deep_ffn_stacks_end_to_end(tmp_path, space):
    """The tiny preset's hourglass grid (K up to 8) and joint space walked exhaustively: every K > 1 member is a
    real training, recorded with its budget-matched parameter count (the shape's, not the baseline's)."""
    storage = sqlite_url(tmp_path / "deep.db")
    options = SpaceOptions(space=space, **GRID)
    members = build_space(options, defaults=get_preset("tiny").baseline).count()
    assert 4 <= members <= 30
    search = run_search(SearchConfig(space=options, preset="tiny", storage=storage, trials=members,
                                     pruner="none", train_overrides=(("tokens", 2048),)))
    assert search.exhaustive and search.space.count() == members
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, members)
    done = counted(trials)
    assert sorted(t.user_attrs["key"] for t in done) == sorted(arch.key() for arch in search.space)
    deep = [t for t in done if t.user_attrs["k"] > 1]
    assert {t.user_attrs["k"] for t in deep} >= {2, 8}
    budget = search.baseline.n_params()["total"]
    for t in deep:
        a = t.user_attrs
        assert t.state == TrialState.COMPLETE and a["status"] == "ok" and a["val_loss"] < 5.55  # below ln 256
        ffn = a["arch"]["ffn"]
        assert (ffn["k"], ffn["hidden"]) == (a["k"], a["d_h"]) and a["d_h"] < 4 * a["d_model"]
        units = a["layers"] * a["k"] * a["d_h"] + ffn.get("wider", 0)  # d_h + 1 in `wider` of the sub-MLPs
        assert a["params_breakdown"]["ffn"] == 3 * a["d_model"] * units
        assert abs(a["params"] - budget) <= search.space.describe()["tolerance"] * budget
        assert len(a["attention_distance"]) == a["layers"]
    if space == "joint":  # K-deep stacks with a Prism staircase on top
        assert any(t.user_attrs["k"] > 1 and len(set(t.user_attrs["heads"])) > 1 for t in done)


def test_objectives_loss_and_tokens_per_s_give_a_minimise_maximise_study(tmp_path):
    storage = sqlite_url(tmp_path / "speed.db")
    search = run_search(SearchConfig(space=tiny_space(layers=6), preset="tiny", storage=storage, trials=3,
                                     objectives=("loss", "tokens_per_s"), train_overrides=(("tokens", 2048),)))
    study = search.study
    assert [d.name for d in study.directions] == ["MINIMIZE", "MAXIMIZE"]
    assert type(study.sampler).__name__ == "NSGAIISampler"
    trials = study.get_trials(deepcopy=False)
    assert_no_repeated_work(trials, 3)
    for t in counted(trials):
        assert t.state == TrialState.COMPLETE  # several objectives: Optuna does not prune
        assert t.values == [t.user_attrs["val_loss"], t.user_attrs["tokens_per_s"]] and t.values[1] > 0
    assert study.best_trials  # the Pareto front of loss against speed


def test_a_cpu_long_trial_is_eight_times_the_tokens_and_a_quarter_in_already_below_the_cpu_proxy(builtin_data,
                                                                                              cpu_baseline_result):
    """The first quarter of a `cpu-long` trial (262k tokens, lr 3e-3), stopped at its first evaluation as a pruner
    would stop it, against the default `cpu` proxy's whole trial of the same shape. (Whole runs: the reference
    panel, ``benchmarks/data/reference_panel.json``: the baseline's 4 seeds are at 2.69 after 65k tokens and end
    at 2.02-2.21.)"""
    from runners.proxy import run

    long, short = get_preset("cpu-long"), get_preset("cpu")
    assert long.baseline == short.baseline and long.train.tokens == 8 * short.train.tokens == 262_144
    result = run(long.baseline, long.train, builtin_data, report=lambda tokens, loss: tokens >= 65_536)
    assert result.status == "pruned" and result.tokens_seen == 65_536
    assert [tokens for tokens, _ in result.eval_curve] == [65_536]  # the first evaluation of the whole run's
    reference = cpu_baseline_result  # the same shape, trained by the `cpu` preset
    assert result.val_loss < reference.val_loss - 0.1, (result.val_loss, reference.val_loss)
