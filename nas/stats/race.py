"""The race after an exhaustive walk, as pure functions of the stored scores (no storage, no torch).

Shared by the planner (which trial to run next, ``nas.study.planning``) and the report (which
shape won, and how honest its interval is, ``reports.summary``), so both read the same race
from the same trials. See ``nas.study.planning`` for the procedure.
"""

from __future__ import annotations

from dataclasses import dataclass

from nas.stats.comparisons import ALPHA, holm_rejections, worse_than
from nas.stats.scores import ShapeScores

RACE_ROLES = ("race", "confirm")


@dataclass(frozen=True)
class RaceState:
    """Candidates (baseline first), who is still in, and the leader (best mean over race seeds)."""

    candidates: tuple[str, ...]
    alive: tuple[str, ...]
    leader: str | None
    runner_up: str | None = None  # the best mean over race seeds among the others

    @property
    def finished(self) -> bool:
        return len(self.alive) == 1


def without_seed(scores: ShapeScores, seed: int) -> ShapeScores:
    """``scores`` without the training on ``seed`` (the first pass's, which selected the candidates)."""
    keep = [i for i, s in enumerate(scores.seeds) if s != seed]
    return ShapeScores(scores.key, tuple(scores.trials[i] for i in keep), tuple(scores.seeds[i] for i in keep),
                       tuple(scores.losses[i] for i in keep))


def first_pass_candidates(scores: dict[str, ShapeScores], baseline: str, base_seed: int,
                          race_size: int) -> tuple[str, ...]:
    """The baseline, then the ``race_size`` best shapes on the first-pass seed."""
    first = {key: dict(zip(s.seeds, s.losses)).get(base_seed) for key, s in scores.items()}
    ranked = sorted((key for key, loss in first.items() if loss is not None and key != baseline),
                    key=lambda key: (first[key], scores[key].first_trial))
    return (baseline, *ranked[:race_size])


def survivors(race: dict[str, ShapeScores], candidates: tuple[str, ...],
              alpha: float = ALPHA) -> tuple[tuple[str, ...], str | None]:
    """(the candidates not significantly worse than the leader, the leader), given their race seeds only."""
    raced = {key: s for key, s in race.items() if s.n}
    if not raced:
        return candidates, None
    leader = min(raced, key=lambda key: (raced[key].mean, candidates.index(key)))
    dropped = holm_rejections(worse_than(raced, leader), alpha)
    return tuple(key for key in candidates if key not in dropped), leader


def race_state(scores: dict[str, ShapeScores], candidates: tuple[str, ...], base_seed: int) -> RaceState:
    race = {key: without_seed(scores[key], base_seed) for key in candidates if key in scores}
    alive, leader = survivors(race, candidates)
    others = [key for key in race if key != leader and race[key].n]
    runner_up = min(others, key=lambda key: (race[key].mean, candidates.index(key)), default=None)
    return RaceState(candidates, alive, leader, runner_up)
