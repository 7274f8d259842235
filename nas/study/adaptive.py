"""Adaptive replicates after an exhaustive walk: top-two Thompson sampling on the shrunk posterior.

Pure functions of the stored scores (no storage, no torch), shared by the planner (which shape to
train next, ``nas.study.planning``) and the report (the pick, its tied set and its interval,
``reports.summary``), so both read one state from the same trials. ``--replicates adaptive``:

- **the posterior.** Every stored score enters the two-way random-effects model of
  ``reports.shrinkage`` (``L = shape level + seed effect + noise``; the shape levels' prior
  ``N(mean, tau^2)`` and the noise ``s2`` from the study itself: REML, and the posterior averaged
  over what the likelihood leaves open of ``s2 / tau^2``). It is refitted from the storage at every
  call, so the prior follows the trials as they arrive. The allocation's fit restricts ``tau >=
  MIN_TAU_RATIO * sigma``, so that a likelihood favouring no spread early on does not stop it
  exploring; the report's pick and intervals use the unrestricted fit.
- **the warm-up.** ``s2`` needs shapes with two seeds: first the baseline and the ``WARMUP`` best
  shapes of the first pass train on the next seed (``WARMUP`` degrees of freedom for ``s2``).
- **the allocation** (Russo, "Simple Bayesian algorithms for best-arm identification", COLT 2016;
  top-two Thompson sampling, ``beta = 1/2``). Draw every shape's level jointly from the posterior;
  the shape that comes out best is the *leader*. With probability 1/2 train the leader; else draw
  again until another shape comes out best (the *challenger*) and train that. Every member of the
  space stays a candidate at every call: a shape is never dropped for good, and an unraced one
  whose posterior could still be best is drawn as often as that chance says (the race's fixed
  candidates, which held the true best in about half of figure 10's studies, are gone).
- **common seeds.** The chosen shape trains on its next seed: the lowest seed above the base seed
  that it has not trained on, so shapes meet on the same seeds and the model reads each seed's
  effect off every shape trained there.
- **the stopping rule.** The pick is the shape with the lowest posterior mean (the board's rank
  1). It is *settled* when its posterior probability of being the best reaches ``1 - ALPHA``;
  from then on the trials go to fresh seeds of the pick and of the baseline (role
  ``adaptive-confirm``), which narrow the pick's gain interval, as the race's ``confirm`` does.
- **the tied set** is the posterior's 95 % credible set of the best: the fewest shapes whose
  probabilities of being the best add up to ``1 - ALPHA`` (the pick first). Those are the shapes
  the data cannot separate from the pick at the study's level.

The probabilities come from ``DRAWS`` joint posterior draws with a generator seeded by the study's
base seed and its number of scores, so a study's state is reproducible from its trials, and two
workers that plan at once draw the same choice (the second then takes the shape's next free seed:
no (shape, seed) is trained twice).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nas.study.records import ShapeScores, seed_adjusted_means
from reports.shrinkage import Fit, fit, rank_shapes
from reports.statistics import ALPHA

ADAPTIVE_ROLES = ("adaptive", "adaptive-confirm")
WARMUP = 4  # first-pass best shapes that, with the baseline, open the second seed
DRAWS = 4000  # joint posterior draws for the report's probabilities of being the best (fewer for large spaces)
PLANNING_DRAWS = 1000  # the planner's: enough to tell P(best) >= 0.95 to about +-0.007
MIN_TAU_RATIO = 0.1  # the allocation's floor on tau / sigma (reports.shrinkage.fit): keeps exploring at tau^ = 0


@dataclass(frozen=True)
class AdaptiveState:
    """What the posterior says now: the pick, every shape's chance of being the best, the tied set."""

    pick: str | None
    p_best: dict[str, float]  # posterior P(shape is the best); empty before the noise can be estimated
    tied: tuple[str, ...]  # the 1 - ALPHA credible set of the best, the pick first
    fit: Fit | None  # the allocation's fit (tau floored), or None

    @property
    def estimable(self) -> bool:
        return bool(self.p_best)

    @property
    def settled(self) -> bool:
        return self.pick is not None and self.p_best.get(self.pick, 0.0) >= 1 - ALPHA


def rng_for(scores: dict[str, ShapeScores], base_seed: int) -> np.random.Generator:
    """A generator fixed by the study's base seed and its number of scores: the same trials, the same draws."""
    return np.random.default_rng([base_seed & 0xFFFFFFFF, sum(s.n for s in scores.values())])


def draws_for(shapes: int, draws: int = DRAWS) -> int:
    return max(500, min(draws, 4_000_000 // max(1, shapes)))


def adaptive_state(scores: dict[str, ShapeScores], baseline: str, base_seed: int,
                   draws: int = DRAWS) -> AdaptiveState:
    """The pick (the board's rank 1: ``reports.shrinkage.rank_shapes``), P(best) per shape and the credible set."""
    if not scores:
        return AdaptiveState(None, {}, (), None)
    pick = rank_shapes(scores, baseline).order[0]
    model = fit(scores, MIN_TAU_RATIO)
    samples = model.draws(rng_for(scores, base_seed), draws_for(len(scores), draws)) if model else None
    if model is None or samples is None:
        return AdaptiveState(pick, {}, (pick,), model)
    wins = np.bincount(np.argmin(samples, axis=1), minlength=len(model.keys)) / len(samples)  # (S,)
    p_best = {key: float(w) for key, w in zip(model.keys, wins)}
    return AdaptiveState(pick, p_best, credible_set(p_best, pick), model)


def credible_set(p_best: dict[str, float], pick: str, level: float = 1 - ALPHA) -> tuple[str, ...]:
    """The pick, then the most probable others, until their probabilities of being the best reach ``level``."""
    chosen, total = [pick], p_best.get(pick, 0.0)
    for key in sorted(p_best, key=lambda k: -p_best[k]):
        if total >= level:
            break
        if key != pick and p_best[key] > 0:
            chosen.append(key)
            total += p_best[key]
    return tuple(chosen)


def warmup_shapes(scores: dict[str, ShapeScores], baseline: str) -> tuple[str, ...]:
    """The baseline and the ``WARMUP`` best shapes by seed-adjusted loss: the second seed's shapes."""
    adjusted = seed_adjusted_means(scores, baseline)
    others = sorted((k for k in scores if k != baseline), key=lambda k: (adjusted[k], scores[k].first_trial))
    return (baseline, *others[:WARMUP]) if baseline in scores else tuple(others[:WARMUP + 1])


def top_two(state: AdaptiveState, rng: np.random.Generator) -> str:
    """Top-two Thompson sampling's choice (module docstring): the leader of one posterior draw, or, half of the
    time, the best of the first later draw that another shape wins (the leader when no draw of 200 does)."""
    model = state.fit
    assert model is not None and state.estimable
    samples = model.draws(rng, 200)
    assert samples is not None
    winners = np.argmin(samples, axis=1)  # (200,)
    leader = int(winners[0])
    if rng.random() < 0.5:
        return model.keys[leader]
    others = winners[1:][winners[1:] != leader]
    return model.keys[int(others[0])] if len(others) else model.keys[leader]


def next_shape(scores: dict[str, ShapeScores], baseline: str, base_seed: int,
               trained: dict[str, set[int]]) -> tuple[str, str]:
    """(shape, role) to train next; ``trained`` maps a shape to the seeds it has trained, is training or has queued.

    Warm-up shapes missing the second seed first; then, once the pick is settled, the pick and the baseline
    alternately (fewest seeds first); else top-two Thompson sampling."""
    second = base_seed + 1
    waiting = [k for k in warmup_shapes(scores, baseline) if second not in trained.get(k, set())]
    if waiting:
        return waiting[0], "adaptive"
    state = adaptive_state(scores, baseline, base_seed, PLANNING_DRAWS)
    if not state.estimable:  # the warm-up is in flight: the shape with the fewest seeds among its shapes
        return min(warmup_shapes(scores, baseline), key=lambda k: len(trained.get(k, ()))), "adaptive"
    if state.settled and state.pick is not None:
        pair = [k for k in (state.pick, baseline) if k in scores]
        return min(pair, key=lambda k: (len(trained.get(k, ())), pair.index(k))), "adaptive-confirm"
    return top_two(state, rng_for(scores, base_seed + 1)), "adaptive"
