"""The leaderboard and the per-shape scores it ranks by, on studies made with Optuna's API (no training)."""

from __future__ import annotations

import math
from statistics import median, stdev

import optuna
import pytest
from optuna.trial import TrialState
from scipy import stats

from nas.arch import ArchConfig, uniform
from nas.study.records import scores_by_shape, shape_attrs
from reports.leaderboard import ci95, leaderboard

BASE = uniform(4, 32, 4, 256)
STEP = ArchConfig(n_layers=4, d_model=32, heads=(2, 2, 4, 4), ffn=BASE.ffn, vocab_size=256)


def add(study: optuna.Study, arch: ArchConfig, seed: int, loss: float | None, state=TrialState.COMPLETE,
        role: str = "member", **attrs) -> None:
    user_attrs = {**shape_attrs(arch, seed, role), "val_loss": loss, "tokens_per_s": 1000.0 + seed, **attrs}
    study.add_trial(optuna.trial.create_trial(state=state, value=loss if state == TrialState.COMPLETE else None,
                                              user_attrs=user_attrs))


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    study.set_user_attr("nas:baseline_key", BASE.key())
    return study


def test_ci95_is_students_t_at_every_sample_size():
    for n in (2, 5, 30, 31, 32, 33, 100):
        values = [3.0 + 0.01 * ((7 * i) % 11) for i in range(n)]
        expected = stats.t.ppf(0.975, n - 1) * stdev(values) / math.sqrt(n)
        assert ci95(values) == pytest.approx(expected, rel=1e-12)
    # no jump from t to the normal quantile at df = 31: the interval narrows smoothly with n
    widths = [ci95([0.0, 1.0] * (n // 2)) * math.sqrt(n) / stdev([0.0, 1.0] * (n // 2)) for n in range(30, 36, 2)]
    assert widths[0] > widths[1] > widths[2] > stats.norm.ppf(0.975)
    assert ci95([3.0]) is None


def test_scores_by_shape_keeps_completed_trainings_only_in_first_trial_order(study):
    add(study, STEP, 0, 3.0)
    add(study, BASE, 0, 3.2, role="baseline")
    add(study, STEP, 1, 3.4, role="replicate")
    add(study, STEP, 2, None, state=TrialState.PRUNED)  # pruned: no score
    add(study, BASE, 0, 3.2, duplicate_of=1)  # answered from trial 1: not a second seed
    add(study, BASE, 1, None, state=TrialState.FAIL, status="diverged")
    add(study, BASE, 2, 9.9, surplus=True)
    scores = scores_by_shape(study.get_trials())
    assert list(scores) == [STEP.key(), BASE.key()]
    assert scores[STEP.key()].trials == (0, 2) and scores[STEP.key()].seeds == (0, 1)
    assert scores[STEP.key()].mean == pytest.approx(3.2) and scores[BASE.key()].losses == (3.2,)


def test_leaderboard_rows_carry_mean_interval_gain_and_the_shape(study):
    for seed, loss in enumerate((3.30, 3.34, 3.26)):
        add(study, BASE, seed, loss, role="baseline" if seed == 0 else "replicate")
    for seed, loss in enumerate((3.20, 3.25)):
        add(study, STEP, seed, loss)
    board = leaderboard(study)
    assert list(board["rank"]) == [1, 2] and list(board["key"]) == [STEP.key(), BASE.key()]
    best, base = board.iloc[0], board.iloc[1]
    assert best["mean_loss"] == pytest.approx(3.225) and base["mean_loss"] == pytest.approx(3.30)
    # adjusted: the baseline's mean plus the mean paired difference on seeds 0 and 1, (-0.10 - 0.09) / 2
    assert best["adjusted_loss"] == pytest.approx(3.205) and base["adjusted_loss"] == pytest.approx(3.30)
    assert best["gain_pct"] == pytest.approx(100 * (3.30 - 3.205) / 3.30) and base["gain_pct"] == 0
    assert best["ci95"] == pytest.approx(ci95([3.20, 3.25])) and best["seeds"] == 2
    assert ArchConfig.from_dict(best["arch"]) == STEP and base["is_baseline"] and best["heads"] == "2x2,4x2"
    assert best["tokens_per_s"] == pytest.approx(median([1000.0, 1001.0]))
    assert len(leaderboard(study, top=1)) == 2  # the baseline is always shown


def test_an_empty_study_has_an_empty_leaderboard(study):
    assert leaderboard(study).empty


def test_a_one_seed_shape_ranks_by_its_paired_difference_not_by_its_seeds_luck(study):
    """Seed 0 is lucky for every shape (all 0.1 lower): a one-seed shape must not outrank a shape measured on
    nine seeds that beats the baseline on every one of them."""
    raced = ArchConfig(n_layers=4, d_model=32, heads=(1, 1, 4, 4), ffn=BASE.ffn, vocab_size=256)
    for seed in range(9):
        luck = -0.1 if seed == 0 else 0.0
        add(study, BASE, seed, 3.00 + luck, role="baseline" if seed == 0 else "race")
        add(study, raced, seed, 2.95 + luck, role="member" if seed == 0 else "race")
    add(study, STEP, 0, 2.88)  # one seed, 0.02 better than the baseline on seed 0: worse than `raced` paired
    board = leaderboard(study)
    assert list(board["key"]) == [raced.key(), STEP.key(), BASE.key()]
    assert board["mean_loss"].tolist() == pytest.approx([2.95 - 0.1 / 9, 2.88, 3.0 - 0.1 / 9])
    base_mean = 3.0 - 0.1 / 9
    assert board["adjusted_loss"].tolist() == pytest.approx([2.95 - 0.1 / 9, base_mean - 0.02, base_mean])
    assert board.iloc[1]["gain_pct"] == pytest.approx(100 * 0.02 / base_mean)
    by_plain_mean = board.sort_values("mean_loss")["key"].tolist()
    assert by_plain_mean[0] == STEP.key()  # what the ranking was before: seed 0's luck counted as a gain


def test_without_a_baseline_or_a_common_seed_the_adjusted_loss_is_the_plain_mean(study):
    add(study, STEP, 3, 2.9)
    add(study, BASE, 0, 3.1, role="baseline")
    board = leaderboard(study)
    assert board["adjusted_loss"].tolist() == board["mean_loss"].tolist() == pytest.approx([2.9, 3.1])
    study.set_user_attr("nas:baseline_key", "no-such-shape")
    assert leaderboard(study)["adjusted_loss"].tolist() == pytest.approx([2.9, 3.1])


def test_the_history_line_replays_the_leaderboards_ranking_in_trial_order(study):
    """``reports.dynamics.best_so_far`` updates incrementally; after every training it equals the ranking
    recomputed from scratch on the trials so far (baseline trainings arriving late included, seeds trained twice,
    shapes with and without a seed in common with the baseline, the prior's spread at 0 and above it)."""
    import random
    from types import SimpleNamespace

    from nas.stats.board import ranked_losses, shrunk_gains
    from reports.dynamics import best_so_far

    rng = random.Random(7)
    shapes = [STEP, *(ArchConfig(n_layers=4, d_model=32, heads=h, ffn=BASE.ffn, vocab_size=256)
                      for h in ((1, 1, 4, 4), (1, 2, 4, 4), (2, 4, 4, 4), (1, 1, 2, 4)))]
    effect = {a.key(): rng.gauss(0, 0.1) for a in shapes}
    add(study, STEP, 0, 3.1)  # before the baseline: plain means
    add(study, shapes[1], 9, 3.05)  # never a seed in common with the baseline
    for _ in range(60):
        arch = BASE if rng.random() < 0.25 else rng.choice(shapes)
        add(study, arch, rng.randrange(5), 3.0 + effect.get(arch.key(), 0) + rng.gauss(0, 0.05), role="race")
    trials = study.get_trials()
    xs, ys = best_so_far(SimpleNamespace(baseline_key=BASE.key()), trials)
    assert xs == [t.number for t in trials]
    spreads = set()
    for i, y in enumerate(ys):
        scores = scores_by_shape(trials[:i + 1])
        assert y == pytest.approx(min(ranked_losses(scores, BASE.key()).values()))
        prior = shrunk_gains(scores, BASE.key())[1]
        spreads.add(None if prior is None or not prior.shrinks else prior.tau > 0)
    assert {None, True} <= spreads  # replayed before the prior could be estimated and after


def test_the_rows_above_the_answers_pick_are_said_for_what_they_are():
    """After a race the pick (its winner) sat third on the board, below two shapes with 5 and 6 seeds against its 5,
    and the answer said "2 shapes above it in the leaderboard rest on fewer seeds"."""
    from types import SimpleNamespace

    from nas.stats.scores import ShapeScores
    from reports.summary import above_sentence

    def scores(key: str, n: int) -> ShapeScores:
        return ShapeScores(key, tuple(range(n)), tuple(range(n)), (3.0,) * n)

    data = SimpleNamespace(scores={k: scores(k, n) for k, n in (("a", 5), ("base", 6), ("pick", 5), ("b", 1))})
    race = SimpleNamespace(above=("a", "base"), best="pick", policy="race", race_candidates=("base", "a", "pick"))
    assert above_sentence(data, race) == ("2 shapes with as many seeds or more rank above it on the leaderboard's "
                                          "shrunk expected gain: the race picked it by its paired gain on the race's "
                                          "common seeds.")
    mixed = SimpleNamespace(above=("b", "a"), best="pick", policy="race", race_candidates=("base", "a", "pick"))
    assert above_sentence(data, mixed) == ("1 shape above it in the leaderboard rests on fewer seeds and was not "
                                           "raced; 1 shape with as many seeds or more ranks above it on the "
                                           "leaderboard's shrunk expected gain: the race picked it by its paired "
                                           "gain on the race's common seeds.")


def test_a_trial_its_worker_finished_as_another_failed_it_reads_by_its_state(study):
    """A worker failing a stale trial writes status "abandoned" and its reason, then the state (nas.study.recovery):
    a trial whose own worker told it COMPLETE in between kept the mark, and read as abandoned with a score."""
    from reports.frame import read_study

    add(study, BASE, 0, 3.40, role="baseline")
    add(study, STEP, 0, 3.35, status="abandoned", reason="its heartbeat stopped")
    add(study, STEP, 1, None, state=TrialState.FAIL, status="abandoned", reason="its heartbeat stopped")
    frame = read_study(study).frame
    assert list(frame["status"]) == ["ok", "ok", "abandoned"]
    assert frame["reason"].isna().tolist() == [True, True, False]


def test_a_trial_whose_stored_seed_is_not_a_number_is_left_out_of_the_search_s_reading(study):
    """A storage edited by hand ('seed' = "one"): the readers skip the trial with a warning, while a resumed search's
    planner stopped with a traceback (``int('one')`` in ``key_seed`` and ``scores_by_shape``)."""
    from nas.study.records import key_seed

    add(study, BASE, 0, 3.40, role="baseline")
    add(study, STEP, 0, 3.35)
    study.add_trial(optuna.trial.create_trial(value=3.36, user_attrs={**shape_attrs(STEP, 1, "member"),
                                                                      "val_loss": 3.36, "seed": "one"}))
    trials = study.get_trials(deepcopy=False)
    assert [key_seed(t) for t in trials] == [(BASE.key(), 0), (STEP.key(), 0), None]
    assert scores_by_shape(trials)[STEP.key()].seeds == (0,)
