"""The race after an exhaustive walk, planned by the real planner on trials made with Optuna's API (no training)."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.trial import TrialState

from nas.study.config import SearchConfig
from nas.study.planning import current_race, plan_next
from nas.study.records import shape_attrs
from nas.study.session import Search
from reports.frame import study_data
from reports.summary import summarise
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space

PRESET = get_preset("tiny")


def search_of(trials: int, race_size: int = 8, replicates: str = "race") -> Search:
    space = build_space(SpaceOptions(space="prism", layers=8), defaults=PRESET.baseline)  # 8 schedules
    config = SearchConfig(trials=trials, replicates=replicates, race_size=race_size)
    return Search(config, None, space, PRESET.train, None, True, None, 0)  # type: ignore[arg-type]


def trial_of(search: Search, key: str, seed: int, role: str, loss: float | None, number: int,
             state: TrialState = TrialState.COMPLETE) -> optuna.trial.FrozenTrial:
    arch = next(a for a in search.members() if a.key() == key)
    attrs = {**shape_attrs(arch, seed, role), "val_loss": loss}
    t = optuna.trial.create_trial(state=state, value=loss if state == TrialState.COMPLETE else None,
                                  user_attrs=attrs) if state != TrialState.RUNNING else None
    if t is None:  # a trial some worker is training right now
        t = optuna.trial.FrozenTrial(number=number, state=TrialState.RUNNING, value=None, datetime_start=None,
                                     datetime_complete=None, params={}, distributions={}, user_attrs=attrs,
                                     system_attrs={}, intermediate_values={}, trial_id=number)
    t.number = number
    return t


def play(search: Search, means: dict[str, float], noise: float = 0.02, seed: int = 0) -> list:
    """Run the planner to the study's budget, scoring every plan as mean + shared seed effect + noise."""
    rng = random.Random(seed)
    effects: dict[int, float] = {}
    trials: list = []
    while len(trials) < search.config.trials:
        plan = plan_next(search, trials)
        key, s, role = plan.user_attrs["key"], plan.user_attrs["seed"], plan.user_attrs["role"]
        loss = means[key] + effects.setdefault(s, rng.gauss(0, 0.05)) + rng.gauss(0, noise)
        trials.append(trial_of(search, key, s, role, loss, len(trials)))
    return trials


def test_the_race_keeps_common_seeds_drops_clearly_worse_shapes_and_confirms_the_winner():
    search = search_of(trials=8 + 60, race_size=5)
    keys = [a.key() for a in search.members()]
    baseline = search.baseline.key()
    means = {k: 3.0 + 0.3 * i for i, k in enumerate(keys)}  # the baseline is best; the rest much worse
    means[keys[4]] = 2.8  # ... but one schedule is clearly better still
    trials = play(search, means)
    first_pass = trials[:8]
    assert [t.user_attrs["role"] for t in first_pass] == ["member"] * 8 and {t.user_attrs["seed"] for t in
                                                                                first_pass} == {0}
    race = [t for t in trials if t.user_attrs["role"] == "race"]
    confirm = [t for t in trials if t.user_attrs["role"] == "confirm"]
    state = current_race(search, trials)
    assert state.candidates[0] == baseline and len(state.candidates) == 6
    assert state.finished and state.alive == (keys[4],)  # the others were dropped
    # every round gives the same seed to every candidate still in: the first round has all six
    assert sorted(t.user_attrs["key"] for t in race if t.user_attrs["seed"] == 1) == sorted(state.candidates)
    assert {t.user_attrs["seed"] for t in race} == set(range(1, max(t.user_attrs["seed"] for t in race) + 1))
    # once won, the winner and the baseline get fresh seeds; nothing is trained twice
    assert confirm and {t.user_attrs["key"] for t in confirm} == {keys[4], baseline}
    assert min(t.user_attrs["seed"] for t in confirm) > max(t.user_attrs["seed"] for t in race)
    pairs = [(t.user_attrs["key"], t.user_attrs["seed"]) for t in trials]
    assert len(pairs) == len(set(pairs))
    summary = summarise(study_data("race", [optuna.study.StudyDirection.MINIMIZE], trials,
                                   {"nas:baseline_key": baseline, "nas:identity": {"train": {"seed": 0}}}))
    assert summary.best == keys[4] and summary.tied == [keys[4]]
    assert summary.sentence.startswith("h=") and "beats the baseline by" in summary.sentence
    assert summary.gain.low_pct > 0


def test_with_several_workers_a_taken_slot_moves_the_next_worker_on_instead_of_waiting():
    search = search_of(trials=8 + 40, race_size=3)
    keys = [a.key() for a in search.members()]
    trials = [trial_of(search, k, 0, "member", 3.0 + 0.01 * i, i) for i, k in enumerate(keys)]
    state = current_race(search, trials)
    # three workers are training the first three race slots of round 1 right now
    for key in state.candidates[:3]:
        trials.append(trial_of(search, key, 1, "race", None, len(trials), TrialState.RUNNING))
    plan = plan_next(search, trials)
    assert plan.user_attrs == {"key": state.candidates[3], "seed": 1, "role": "race"}  # the last free slot of round 1
    trials.append(trial_of(search, state.candidates[3], 1, "race", None, len(trials), TrialState.RUNNING))
    plan = plan_next(search, trials)
    assert plan.user_attrs == {"key": state.candidates[0], "seed": 2, "role": "race"}  # round 1 is all taken: round 2


def test_the_fixed_policy_still_replicates_the_baseline_and_the_best():
    search = search_of(trials=8 + 10, replicates="fixed")
    keys = [a.key() for a in search.members()]
    trials = play(search, {k: 3.0 + 0.01 * i for i, k in enumerate(keys)})
    assert {t.user_attrs["role"] for t in trials[8:]} == {"replicate"}


def test_the_fixed_policys_interval_is_simultaneous_over_every_shape_that_received_replicates():
    """The fixed policy's pick is chosen among the shapes that received replicates, on their seeds: its interval is
    simultaneous over them (level ``1 - 0.05 / m``), as the race's is over its candidates; a shape the pick was not
    chosen among keeps the plain 95 % interval."""
    from nas.stats.comparisons import ALPHA, paired_gain

    search = search_of(trials=8 + 30, replicates="fixed")
    keys = [a.key() for a in search.members()]
    baseline = search.baseline.key()
    means = {k: 3.0 + 0.02 * i for i, k in enumerate(keys)}
    means[baseline] = 3.05
    trials = play(search, means, noise=0.03, seed=4)
    data = study_data("fixed", [optuna.study.StudyDirection.MINIMIZE], trials,
                      {"nas:baseline_key": baseline, "nas:identity": {"train": {"seed": 0}}})
    evidence = data.evidence
    chosen_among = evidence.replicated()
    assert 4 <= len(chosen_among) < len(keys) - 1 and baseline not in chosen_among  # the top 4, and any that left it
    pick = summarise(data).best
    assert pick in chosen_among and evidence.interval_alpha(pick) == pytest.approx(ALPHA / len(chosen_among))
    gain = evidence.honest_gain(pick)
    plain = paired_gain(data.scores[pick], data.scores[baseline], evidence.selecting_seeds(pick))
    assert gain.low_pct < plain.low_pct and gain.high_pct > plain.high_pct  # wider than the unadjusted one
    outside = next(k for k in keys if k not in chosen_among and k != baseline)
    assert evidence.interval_alpha(outside) == ALPHA


@pytest.mark.parametrize("replicates", ["race", "fixed"])
def test_a_search_config_rejects_bad_race_options(replicates):
    from nas.errors import UsageError

    with pytest.raises(UsageError, match="--race-size 0 is invalid"):
        SearchConfig(replicates=replicates, race_size=0).validate()
    with pytest.raises(UsageError,
                       match="unknown replicates policy 'best'; choose race, fixed, adaptive, adaptive-answer"):
        SearchConfig(replicates="best").validate()
