"""Planning the next trial of a small space: the exhaustive walk, then seed replicates.

A space with no more members than ``--trials`` is walked exhaustively, in its order; once
every member is trained, the remaining trials are seed replicates of the baseline and the
``replicate_top`` best shapes (by mean loss), least-replicated first. ``None`` lets the
sampler propose instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

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


def plan_next(search: Search, trials: list[FrozenTrial]) -> Plan | None:
    """The next exhaustive member or replicate to enqueue; None lets the sampler propose."""
    if not search.exhaustive:
        return None
    seed = search.train.seed
    seen = visited(trials)
    for arch in search.space:
        if (arch.key(), seed) not in seen:
            return Plan(search.space.params_of(arch), {"key": arch.key(), "seed": seed, "role": "member"})
    return plan_replicate(search, trials, seen)


def plan_replicate(search: Search, trials: list[FrozenTrial], seen: set[tuple[str, int]]) -> Plan:
    """A new seed for the least-replicated of: the baseline and the ``replicate_top`` best shapes (mean loss)."""
    scores = scores_by_shape(trials)
    ranked = sorted(scores.values(), key=lambda s: (s.mean, s.first_trial))
    baseline = search.baseline
    candidates = [baseline.key()] + [s.key for s in ranked if s.key != baseline.key()][: search.config.replicate_top]
    archs = {baseline.key(): baseline}
    for t in trials:
        if t.user_attrs.get("key") in candidates and t.user_attrs["key"] not in archs:
            archs[t.user_attrs["key"]] = arch_of(t)
    seeds = {k: {s for key, s in seen if key == k} for k in candidates}
    key = min(candidates, key=lambda k: (len(seeds[k]), candidates.index(k)))
    seed = next(s for s in range(search.train.seed, search.train.seed + 10**6) if s not in seeds[key])
    return Plan(search.space.params_of(archs[key]), {"key": key, "seed": seed, "role": "replicate"})
