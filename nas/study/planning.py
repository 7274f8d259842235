"""Planning the next trial of a small space: the exhaustive walk, then adaptive replicates (or a race, or fixed).

A space with no more members than ``--trials`` is walked exhaustively, in its order, on the base
seed (the first pass). The remaining trials go, by default, to **adaptive replicates**
(``--replicates adaptive``): the knowledge gradient on the study's shrunk posterior, with the baseline kept in
pace with the pick so that the answer's comparison has seeds on both sides (``nas.study.adaptive``; recomputed
from the storage at every call, like the race). Every policy chooses by the shrunk ranking the readers show
(``nas.stats.board.rank_shapes``; after the first pass, one seed a shape, its order is the first pass's). Figure 10
(``benchmarks/ranking_simulation.py``) measured it against the others on known truths. With
``--replicates race`` they go to a **race** (as irace and F-race race algorithm configurations):

- the candidates are the baseline and the ``race_size`` best members of the first pass;
- round ``r`` gives every candidate still in the race the seed ``base + r`` (the same seed for
  all: same data order, and for Prism members the same initial weights), so they compare on
  common seeds; the first-pass seed, which selected them, takes no part in the race;
- after each result, a candidate is dropped when a one-sided paired t-test on common race seeds
  says it is worse than the current leader (the best mean over race seeds), with Holm's
  correction over the candidates tested (``nas.stats.comparisons``; a pair with one common seed
  borrows the pooled paired sd of the others);
- the race ends when one candidate is left (significantly best); the remaining trials then go
  to fresh seeds of it and of the baseline (role ``confirm``), for the gain's interval.

The plan is recomputed from the storage at every call, so any number of workers on any
number of machines share one race: a (shape, seed) in flight or done is never planned again,
and a worker whose round is taken by others goes on to the next round instead of waiting.
``--replicates fixed`` keeps the earliest policy: seeds for the baseline and the ``replicate_top`` best shapes of the
board, least-replicated first. ``None`` lets the sampler propose instead (spaces
larger than ``--trials``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas.stats.board import rank_shapes
from nas.stats.race import RaceState, first_pass_candidates, race_state
from nas.study.adaptive import BASELINE_PACE, next_shape
from nas.study.records import arch_of, counts, in_flight, key_seed, scores_by_shape
from nas.study.session import Search


@dataclass(frozen=True)
class Plan:
    params: dict[str, Any]
    user_attrs: dict[str, Any]


def visited(trials: list[FrozenTrial]) -> set[tuple[str, int]]:
    """(shape key, seed) trained, being trained, or queued."""
    seen = set()
    for t in trials:
        ks = key_seed(t)
        if ks and (counts(t) or in_flight(t) or t.state == TrialState.WAITING):
            seen.add(ks)
    return seen


# the adaptive allocation for the pick alone (the baseline not kept in pace): figure 10's reference row for what the
# default spent before; not a choice of the command line
PICK_ONLY = "adaptive-pick"
# the knowledge gradient with the answer's sentence valued beside the pick (nas.study.adaptive.answer_value)
ANSWER = "adaptive-answer"


def plan_next(search: Search, trials: list[FrozenTrial]) -> Plan | None:
    """The next exhaustive member, race or replicate trial to run; None lets the sampler propose."""
    if not search.exhaustive:
        return None
    seed = search.train.seed
    seen = visited(trials)
    for arch in search.members():
        if (arch.key(), seed) not in seen:
            return Plan(search.space.params_of(arch), {"key": arch.key(), "seed": seed, "role": "member"})
    if search.config.replicates == "fixed":
        return plan_replicate(search, trials, seen)
    if search.config.replicates in ("adaptive", PICK_ONLY, ANSWER):
        return plan_adaptive(search, trials, seen)
    return plan_race(search, trials, seen)


def current_race(search: Search, trials: list[FrozenTrial]) -> RaceState:
    """The race as the stored trials have it now."""
    scores = scores_by_shape(trials)
    candidates = first_pass_candidates(scores, search.baseline.key(), search.train.seed, search.config.race_size)
    return race_state(scores, candidates, search.train.seed)


def plan_race(search: Search, trials: list[FrozenTrial], seen: set[tuple[str, int]]) -> Plan:
    """The next race (or, once it is won, confirmation) trial: the lowest round with a free slot."""
    state = current_race(search, trials)
    runners, role = state.alive, "race"
    if state.finished:  # the winner and the baseline (or, when the baseline won, its runner-up) get fresh seeds
        role, baseline = "confirm", search.baseline.key()
        other = state.alive[0] if state.alive[0] != baseline else state.runner_up
        runners = tuple(key for key in (other, baseline) if key is not None)
    base = search.train.seed
    for round_ in range(1, 10**6):
        for key in runners:
            if (key, base + round_) not in seen:
                return Plan(search.space.params_of(_arch(search, trials, key)),
                            {"key": key, "seed": base + round_, "role": role})
    raise AssertionError("unreachable: a round always has a free slot")


def plan_adaptive(search: Search, trials: list[FrozenTrial], seen: set[tuple[str, int]]) -> Plan:
    """The next adaptive trial (``nas.study.adaptive``): the chosen shape on its lowest free seed above the base."""
    trained: dict[str, set[int]] = {}
    for key, s in seen:
        trained.setdefault(key, set()).add(s)
    pace = 0.0 if search.config.replicates == PICK_ONLY else BASELINE_PACE
    key, role = next_shape(scores_by_shape(trials), search.baseline.key(), search.train.seed, trained, pace,
                           answer=search.config.replicates == ANSWER)
    seed = next(s for s in range(search.train.seed + 1, search.train.seed + 10**6) if s not in trained.get(key, ()))
    return Plan(search.space.params_of(_arch(search, trials, key)), {"key": key, "seed": seed, "role": role})


def _arch(search: Search, trials: list[FrozenTrial], key: str):
    if key == search.baseline.key():
        return search.baseline
    return next(arch_of(t) for t in trials if t.user_attrs.get("key") == key and t.user_attrs.get("arch"))


def plan_replicate(search: Search, trials: list[FrozenTrial], seen: set[tuple[str, int]]) -> Plan:
    """A new seed for the least-replicated of: the baseline and the ``replicate_top`` best shapes of the board (the
    shrunk ranking every reader shows)."""
    scores = scores_by_shape(trials)
    order = rank_shapes(scores, search.baseline.key(), intervals=False).order
    baseline = search.baseline
    candidates = [baseline.key()] + [key for key in order if key != baseline.key()][: search.config.replicate_top]
    archs = {baseline.key(): baseline}
    for t in trials:
        if t.user_attrs.get("key") in candidates and t.user_attrs["key"] not in archs:
            archs[t.user_attrs["key"]] = arch_of(t)
    seeds = {k: {s for key, s in seen if key == k} for k in candidates}
    key = min(candidates, key=lambda k: (len(seeds[k]), candidates.index(k)))
    seed = next(s for s in range(search.train.seed, search.train.seed + 10**6) if s not in seeds[key])
    return Plan(search.space.params_of(archs[key]), {"key": key, "seed": seed, "role": "replicate"})
