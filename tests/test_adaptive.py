"""Adaptive replicates (``--replicates adaptive``, ``nas.study.adaptive``): the knowledge gradient on the shrunk
posterior, planned by the real planner on trials made with Optuna's API (no training)."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from nas.stats.adaptive import PLANNING_DRAWS, adaptive_state, credible_set, knowledge_gradients
from nas.stats.shrinkage import fit
from nas.study.adaptive import WARMUP, next_shape
from nas.study.planning import plan_next
from nas.study.records import scores_by_shape
from reports.frame import study_data
from reports.summary import summarise
from tests.test_race import play, search_of, trial_of
from tests.test_shrinkage import BASE, TABLE, mixture_posterior, scores_of


def summary_of(search, trials):
    return summarise(study_data("adaptive", [optuna.study.StudyDirection.MINIMIZE], trials,
                                {"nas:baseline_key": search.baseline.key(), "nas:identity": {"train": {"seed": 0}}}))


def test_posterior_draws_have_the_mixed_model_posteriors_mean_and_covariance():
    model = fit(scores_of(TABLE))
    samples = model.draws(np.random.default_rng(0), 200_000)
    mean, cov = mixture_posterior(TABLE, model)
    assert samples.mean(axis=0) == pytest.approx(mean, abs=2e-3) and model.m == pytest.approx(mean, abs=1e-9)
    # the joint covariance, shared seed effects and the spread over lambda included
    assert np.cov(samples, rowvar=False) == pytest.approx(cov, abs=4e-4)


def test_the_knowledge_gradient_is_the_expected_drop_of_the_lowest_posterior_mean_after_one_more_score():
    mu = np.array([2.90, 2.93, 2.95, 3.10])
    v = np.array([0.0004, 0.004, 0.0002, 0.004])  # the leader known well; a close and a far shape both uncertain
    s2 = 0.006
    gradient = knowledge_gradients(mu, v, s2)
    rng = np.random.default_rng(1)
    for k in range(len(mu)):  # Monte Carlo: draw the next score, update mu_k, see how far the minimum falls
        y = rng.normal(mu[k], math.sqrt(v[k] + s2), 400_000)
        updated = mu[k] + v[k] / (v[k] + s2) * (y - mu[k])
        others = np.delete(mu, k).min()
        assert gradient[k] == pytest.approx(mu.min() - np.minimum(updated, others).mean(), abs=1.5e-4)
    # the close uncertain shape is worth a seed; the far one and the well-known one are not
    assert int(np.argmax(gradient)) == 1 and gradient[1] > 5 * max(gradient[2], gradient[3])


def test_the_credible_set_holds_the_pick_then_the_likeliest_until_95_percent():
    p = {"a": 0.5, "b": 0.3, "c": 0.16, "d": 0.04}
    assert credible_set(p, "a") == ("a", "b", "c")
    assert credible_set(p, "b") == ("b", "a", "c")  # the pick first even when another shape is likelier
    assert credible_set({"a": 0.97, "b": 0.03}, "a") == ("a",)


def test_warm_up_opens_the_second_seed_then_the_knowledge_gradient_keeps_common_seeds_and_finds_the_best():
    search = search_of(trials=8 + 50, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    baseline = search.baseline.key()
    means = {k: 3.0 + 0.02 * i for i, k in enumerate(keys)}
    means[baseline] = 3.0
    best = next(k for k in keys[3:] if k != baseline)
    means[best] = 2.9  # clearly better than all, though not first in the walk's order
    trials = play(search, means, noise=0.03)
    replicates = trials[8:]
    assert {t.user_attrs["role"] for t in replicates} <= {"adaptive", "adaptive-confirm"}
    # the warm-up: the baseline and the WARMUP best of the first pass on seed 1, before anything else
    warm = replicates[:WARMUP + 1]
    assert {t.user_attrs["seed"] for t in warm} == {1} and warm[0].user_attrs["key"] == baseline
    pairs = [(t.user_attrs["key"], t.user_attrs["seed"]) for t in trials]
    assert len(pairs) == len(set(pairs))  # no (shape, seed) twice
    by_shape: dict[str, list[int]] = {}
    for key, seed in pairs:
        by_shape.setdefault(key, []).append(seed)
    assert all(sorted(seeds) == list(range(len(seeds))) for seeds in by_shape.values())  # common seeds 0, 1, 2, ...
    trained = Counter(t.user_attrs["key"] for t in replicates if t.user_attrs["key"] != baseline)
    assert trained.most_common(1)[0][0] == best  # the seeds went to the best shape
    summary = summary_of(search, trials)
    assert summary.best == best and summary.tied[0] == best
    assert summary.gain.posterior and summary.gain.low_pct > 0
    assert "beats the baseline by" in summary.sentence and "95 % credible interval" in summary.sentence
    # settled: the pick's posterior probability of being the best passed 95 %, and the rest went to the pick and
    # the baseline (the gain's interval)
    confirm = [t for t in replicates if t.user_attrs["role"] == "adaptive-confirm"]
    assert confirm and {t.user_attrs["key"] for t in confirm} == {best, baseline}
    state = adaptive_state(scores_by_shape(trials), baseline, 0)
    assert state.settled and state.p_best[best] >= 0.95


def test_where_nothing_stands_out_the_tied_set_stays_wide_and_the_plan_is_reproducible():
    search = search_of(trials=8 + 20, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    trials = play(search, dict.fromkeys(keys, 3.0), noise=0.05, seed=3)
    assert [t.user_attrs["key"] for t in trials] == [t.user_attrs["key"] for t in
                                                     play(search, dict.fromkeys(keys, 3.0), noise=0.05, seed=3)]
    summary = summary_of(search, trials)
    claims = re.search(r"(?<![Nn]o shape )beats the baseline", summary.sentence)  # "No shape beats ..." claims nothing
    assert len(summary.tied) >= 3 and not claims, summary.sentence


def test_a_shape_another_worker_trains_moves_the_next_worker_to_a_free_seed():
    search = search_of(trials=8 + 40, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    trials = [trial_of(search, k, 0, "member", 3.0 + 0.01 * i, i) for i, k in enumerate(keys)]
    first = plan_next(search, trials)
    assert first.user_attrs["role"] == "adaptive" and first.user_attrs["seed"] == 1
    trials.append(trial_of(search, first.user_attrs["key"], 1, "adaptive", None, len(trials), TrialState.RUNNING))
    second = plan_next(search, trials)
    assert (second.user_attrs["key"], second.user_attrs["seed"]) != (first.user_attrs["key"], 1)


def test_before_the_noise_can_be_estimated_the_warm_up_shapes_come_first():
    scores = scores_of({BASE: {0: 3.0}, "a": {0: 2.9}, "b": {0: 2.95}, "c": {0: 3.2}, "d": {0: 3.1},
                        "e": {0: 3.3}, "f": {0: 3.4}})
    assert not adaptive_state(scores, BASE, 0).estimable
    order = []
    trained: dict[str, set[int]] = {k: {0} for k in scores}
    for _ in range(WARMUP + 1):
        key, role = next_shape(scores, BASE, 0, trained)
        order.append(key)
        trained[key].add(1)
    assert order == [BASE, "a", "b", "d", "c"] and role == "adaptive"


def test_with_more_workers_than_members_a_worker_that_finds_no_score_yet_trains_the_baseline():
    # a 3-member space, 4 workers: the walk's three trainings are all in flight when the fourth plans (it raised
    # "min() arg is an empty sequence" and stopped the search)
    trained: dict[str, set[int]] = {BASE: {0}, "a": {0}, "b": {0}}
    assert next_shape({}, BASE, 0, trained) == (BASE, "adaptive")


def test_the_baseline_keeps_pace_with_the_pick_on_the_picks_seeds():
    """The answer compares the pick with the baseline: once past the warm-up, the baseline trains whenever it has
    fewer seeds (in flight included) than the pick, on the lowest seeds the pick has and it lacks (common seeds).
    Checked at every plan of three real plays, against the pick the planner saw then (in some plays the pick is the
    baseline itself throughout, which then has nothing to keep pace with)."""
    search = search_of(trials=8 + 40, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    baseline = search.baseline.key()
    means = {k: 3.0 + 0.005 * i for i, k in enumerate(keys)}
    means[baseline], best = 3.0, next(k for k in keys[2:] if k != baseline)
    means[best] = 2.98  # close enough at this noise that the pick does not settle: no confirm phase
    lagging = 0
    for play_seed in range(3):
        trials = play(search, means, noise=0.1, seed=play_seed)
        assert not any(t.user_attrs["role"] == "adaptive-confirm" for t in trials)
        for i in range(8 + WARMUP + 1, len(trials)):
            scores = scores_by_shape(trials[:i])
            state = adaptive_state(scores, baseline, 0, PLANNING_DRAWS, plug_in=True)
            if not state.estimable or state.pick in (None, baseline):
                continue
            pick_seeds, base_seeds = set(scores[state.pick].seeds), set(scores[baseline].seeds)
            if len(base_seeds) < len(pick_seeds):
                lagging += 1
                planned = trials[i].user_attrs
                assert (planned["key"], planned["seed"]) == (baseline, min(pick_seeds - base_seeds))
    assert lagging >= 3  # the situation arose: a contender was the pick, ahead of the baseline on seeds


def test_next_shape_trains_the_baseline_when_it_lags_the_pick():
    scores = scores_of({BASE: {0: 3.0, 1: 3.02}, "a": {0: 2.95, 1: 3.0, 2: 2.93, 3: 2.99}, "b": {0: 2.97, 1: 2.99},
                        "c": {0: 3.01, 1: 3.04}, "d": {0: 3.0, 1: 2.97}, "e": {0: 3.02, 1: 3.05}})
    trained = {k: set(s.seeds) for k, s in scores.items()}
    state = adaptive_state(scores, BASE, 0, plug_in=True)
    assert state.pick == "a" and not state.settled
    assert next_shape(scores, BASE, 0, trained) == (BASE, "adaptive")
    key, _ = next_shape(scores, BASE, 0, trained, pace=0.0)  # the pick-only allocation (figure 10's reference)
    assert key != BASE
    trained[BASE] |= {2, 3}  # in flight: the baseline has caught up, so the knowledge gradient chooses again
    assert next_shape(scores, BASE, 0, trained)[0] != BASE


def test_summarise_fits_each_variant_of_the_model_once(monkeypatch):
    """The board, the answer's interval, its resolution and the adaptive state read one fit per variant of the
    shrinkage model (averaged, floored for the allocation, plug-in for the resolution), not one per question."""
    import nas.stats.evidence

    search = search_of(trials=8 + 24, replicates="adaptive")
    keys = [a.key() for a in search.members()]
    trials = play(search, {k: 3.0 + 0.01 * i for i, k in enumerate(keys)}, noise=0.04)
    calls: list[tuple] = []
    real = nas.stats.evidence.fit

    def counted(scores, min_tau_ratio=0.0, plug_in=False, known=None, baseline=None):
        calls.append((min_tau_ratio, plug_in, baseline))
        # the board and the answer hold the baseline as a fixed effect; the allocation's floored fit keeps it a member
        assert baseline == (search.baseline.key() if min_tau_ratio == 0 else None), (min_tau_ratio, baseline)
        return real(scores, min_tau_ratio, plug_in, known, baseline)

    monkeypatch.setattr(nas.stats.evidence, "fit", counted)
    import nas.stats.adaptive
    import nas.stats.resolution
    import nas.stats.shrinkage

    for module in (nas.stats.shrinkage, nas.stats.adaptive, nas.stats.resolution):
        monkeypatch.setattr(module, "fit", counted)
    summary = summary_of(search, trials)
    assert summary.resolution is not None and summary.limit is not None
    assert len(calls) == len(set(calls)) <= 3, calls


def test_the_answer_value_is_the_fall_of_the_picks_detectable_gain_per_trial():
    """``adaptive-answer``'s value of one more seed of the pick: its interval's MDG times the fall of ``sqrt(1/n +
    1/n_b)``, over the trials it costs (two while the baseline would lag the pick, one when it is ahead)."""
    from nas.stats.comparisons import ALPHA
    from nas.stats.resolution import gain_design, posterior_resolution
    from nas.study.adaptive import answer_value

    scores = scores_of({BASE: {0: 3.0, 1: 3.02}, "a": {0: 2.95, 1: 3.0, 2: 2.93, 3: 2.99}, "b": {0: 2.97, 1: 2.99},
                        "c": {0: 3.01, 1: 3.04}, "d": {0: 3.0, 1: 2.97}, "e": {0: 3.02, 1: 3.05}})
    trained = {k: set(s.seeds) for k, s in scores.items()}
    state = adaptive_state(scores, BASE, 0, PLANNING_DRAWS, plug_in=True)
    assert state.pick == "a"
    mdg = posterior_resolution(gain_design(scores, "a", BASE, state.fit), 4, 2, ALPHA, 1.0).gain
    lagging = mdg * (1 - math.sqrt((1 / 5 + 1 / 3) / (1 / 4 + 1 / 2))) / 2
    assert answer_value(scores, state, "a", BASE, trained) == pytest.approx(lagging, rel=1e-12) and lagging > 0
    trained[BASE] |= {2, 3, 4, 5}  # in flight: the baseline ahead of the pick, so one trial buys the pick's seed
    ahead = mdg * (1 - math.sqrt((1 / 5 + 1 / 6) / (1 / 4 + 1 / 6)))
    assert answer_value(scores, state, "a", BASE, trained) == pytest.approx(ahead, rel=1e-12)
    assert answer_value(scores, state, BASE, BASE, trained) == 0.0  # the baseline against itself: nothing to answer


def test_in_a_flat_space_adaptive_answer_gives_the_answers_comparison_its_seeds():
    """Shapes 0.002-0.012 nats apart under a noise of 0.1 (the pick cannot be found in 40 trials): the default spreads
    its seeds over contenders, ``adaptive-answer`` spends them on the pick and the baseline, on common seeds (real
    planner, three plays each)."""
    shared = {}
    for policy in ("adaptive", "adaptive-answer"):
        search = search_of(trials=8 + 40, replicates=policy)
        keys = [a.key() for a in search.members()]
        baseline = search.baseline.key()
        means = {k: 3.0 + 0.002 * (i % 7) for i, k in enumerate(keys)}
        means[baseline] = 3.03
        shared[policy] = 0
        for play_seed in range(3):
            trials = play(search, means, noise=0.1, seed=play_seed)
            scores = scores_by_shape(trials)
            pick = adaptive_state(scores, baseline, 0, PLANNING_DRAWS, plug_in=True).pick
            if pick != baseline:
                shared[policy] += len(set(scores[pick].seeds) & set(scores[baseline].seeds))
    assert shared["adaptive-answer"] >= 2 * shared["adaptive"] + 10, shared


def test_when_the_baseline_is_the_pick_the_sentences_subject_is_the_best_other_shape_and_the_baseline_keeps_its_pace():
    """The sentence then compares the best other shape with the baseline (``reports.summary.study_resolution``), so
    ``adaptive-answer`` values that shape's seeds, and the baseline keeps pace with it rather than with itself."""
    from nas.study.adaptive import sentence_subject

    scores = scores_of({BASE: {0: 2.93, 1: 2.96, 2: 2.94}, "a": {0: 2.95, 1: 2.97, 2: 2.94, 3: 2.96},
                        "b": {0: 2.96, 1: 3.0}, "c": {0: 3.0, 1: 2.97}, "d": {0: 2.98, 1: 3.01},
                        "e": {0: 2.99, 1: 3.02}})
    trained = {k: set(s.seeds) for k, s in scores.items()}
    state = adaptive_state(scores, BASE, 0, PLANNING_DRAWS, plug_in=True)
    assert state.pick == BASE and not state.settled and sentence_subject(state, BASE) == "a"
    assert next_shape(scores, BASE, 0, trained, answer=True) == (BASE, "adaptive")  # 3 seeds against a's 4
    trained[BASE].add(3)  # in flight: level with the subject, whose next seed now buys the sentence the most
    assert next_shape(scores, BASE, 0, trained, answer=True) == ("a", "adaptive")
    trained[BASE].discard(3)  # the default too keeps the baseline in pace with the subject, not with itself
    assert next_shape(scores, BASE, 0, trained) == (BASE, "adaptive")


def test_once_the_baseline_is_settled_as_the_pick_the_confirm_trials_go_to_the_subject_and_the_baseline():
    """The confirm rule alternates the sentence's two shapes: with the baseline the pick, the best other shape and
    the baseline (fewest seeds first), not the baseline alone."""
    from nas.study.adaptive import sentence_subject

    table = {BASE: {s: 2.80 + 0.01 * (s % 3) for s in range(10)}, "a": {0: 2.98, 1: 2.99, 2: 2.97},
             **{k: {0: 3.0 + 0.01 * i, 1: 3.02} for i, k in enumerate("bcdef")}}
    scores = scores_of(table)
    trained = {k: set(s.seeds) for k, s in scores.items()}
    state = adaptive_state(scores, BASE, 0, PLANNING_DRAWS, plug_in=True)
    assert state.pick == BASE and state.settled and sentence_subject(state, BASE) == "a"
    assert next_shape(scores, BASE, 0, trained) == ("a", "adaptive-confirm")
