"""Adaptive replicates after an exhaustive walk: the knowledge gradient on the shrunk posterior.

Pure functions of the stored scores (no storage, no torch), shared by the planner (which shape to
train next, ``nas.study.planning``) and the report (the pick, its tied set and its interval,
``reports.summary``), so both read one state from the same trials. ``--replicates adaptive``:

- **the posterior.** Every stored score enters the two-way random-effects model of
  ``reports.shrinkage`` (``L = shape level + seed effect + noise``; the shape levels' prior
  ``N(mean, tau^2)`` and the noise ``s2`` from the study itself, by REML). It is refitted from the
  storage at every call, so the prior follows the trials as they arrive. The report's pick, tied set
  and intervals average the posterior over what the likelihood leaves open of ``s2 / tau^2`` (honest
  intervals); the allocation plugs in the REML estimate (empirical Bayes, ``fit(plug_in=True)``) with
  ``tau >= MIN_TAU_RATIO * sigma``, so that a likelihood favouring no spread early on does not stop it
  exploring. The averaged posterior explores too widely to pick well: top-two Thompson sampling on it
  picked the true best in 0.41 of figure 10's studies after 71 trials at the measured noise, on the
  plug-in one 0.45 (300 of the same studies).
- **the warm-up.** ``s2`` needs shapes with two seeds: first the baseline and the ``WARMUP`` best
  shapes of the first pass train on the next seed (``WARMUP`` degrees of freedom for ``s2``).
- **the allocation**: the knowledge gradient (Frazier, Powell and Dayanik 2008; ``knowledge_gradient``):
  train the shape whose next score is expected to lower the lowest posterior mean the most, from every
  shape's posterior mean and variance and the noise of one score. It weighs a shape's chance of
  changing the pick against how much one more seed can move it, so it screens the first pass's
  promising one-seed shapes and spends more seeds only on the shapes that contend. Every member of the
  space stays a candidate at every call: a shape is never dropped for good. On figure 10's known
  truths (1,000 studies a row) it picked the true best after 71 trials in 0.496 of the studies at the
  measured noise and 0.788 at half of it, against top-two Thompson sampling's (Russo 2016, tried
  first) 0.413 and 0.783, fixed replicates' 0.457 and 0.767 and the race's 0.427 and 0.707: with a
  budget of a fifth of a seed a shape, Thompson's random challengers are spent on shapes whose next
  score could not change the answer.
- **common seeds.** The chosen shape trains on its next seed: the lowest seed above the base seed
  that it has not trained on, so shapes meet on the same seeds and the model reads each seed's
  effect off every shape trained there.
- **the stopping rule.** The pick is the shape with the lowest posterior mean (the board's rank
  1). It is *settled* when its posterior probability of being the best reaches ``1 - ALPHA``;
  from then on the trials go to fresh seeds of the pick and of the baseline (role
  ``adaptive-confirm``), which narrow the pick's gain interval, as the race's ``confirm`` does.
- **the tied set** is the (averaged) posterior's 95 % credible set of the best: the fewest shapes whose
  probabilities of being the best add up to ``1 - ALPHA`` (the pick first). Those are the shapes
  the data cannot separate from the pick at the study's level.

The probabilities come from ``DRAWS`` joint posterior draws with a generator seeded by the study's
base seed and its number of scores, so a study's state is reproducible from its trials. The
allocation is deterministic given the trials; a training in flight counts as a score already taken
(it lowers its shape's variance), so workers that plan at once spread over shapes, and no (shape,
seed) is trained twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm as NORMAL

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
                   draws: int = DRAWS, plug_in: bool = False) -> AdaptiveState:
    """The pick (the board's rank 1: ``reports.shrinkage.rank_shapes``), P(best) per shape and the credible set."""
    if not scores:
        return AdaptiveState(None, {}, (), None)
    pick = rank_shapes(scores, baseline).order[0]
    model = fit(scores, MIN_TAU_RATIO, plug_in=plug_in)
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


def next_shape(scores: dict[str, ShapeScores], baseline: str, base_seed: int,
               trained: dict[str, set[int]]) -> tuple[str, str]:
    """(shape, role) to train next; ``trained`` maps a shape to the seeds it has trained, is training or has queued.

    Warm-up shapes missing the second seed first; then, once the pick is settled, the pick and the baseline
    alternately (fewest seeds first); else the knowledge gradient (its ``pending``: the seeds in ``trained``
    without a score, in flight or failed)."""
    second = base_seed + 1
    waiting = [k for k in warmup_shapes(scores, baseline) if second not in trained.get(k, set())]
    if waiting:
        return waiting[0], "adaptive"
    state = adaptive_state(scores, baseline, base_seed, PLANNING_DRAWS, plug_in=True)
    pending = {k: len(seeds - set(scores[k].seeds)) for k, seeds in trained.items() if k in scores}
    if not state.estimable:  # the warm-up is in flight: the shape with the fewest seeds among its shapes
        return min(warmup_shapes(scores, baseline), key=lambda k: len(trained.get(k, ()))), "adaptive"
    if state.settled and state.pick is not None:
        pair = [k for k in (state.pick, baseline) if k in scores]
        return min(pair, key=lambda k: (len(trained.get(k, ())), pair.index(k))), "adaptive-confirm"
    return knowledge_gradient(state, pending), "adaptive"


def knowledge_gradient(state: AdaptiveState, pending: dict[str, int] | None = None) -> str:
    """The shape whose next score is expected to lower the best posterior mean the most (module docstring).

    Frazier, Powell and Dayanik, "A knowledge-gradient policy for sequential information collection" (SIAM J.
    Control Optim. 2008), for minimisation, on every shape's posterior marginal ``N(mu_k, v_k)`` and a score's
    noise ``s2``::

        sigma~_k = v_k / sqrt(v_k + s2)              (the sd of mu_k's change after one more score)
        KG_k = sigma~_k f(-|mu_k - min_{j != k} mu_j| / sigma~_k),   f(z) = z Phi(z) + phi(z)

    ``pending``: shape -> trainings in flight; each counts as a score already taken (``v_k`` shrunk by it, the
    mean unchanged), so workers that plan at once spread over shapes instead of lining up on one."""
    model = state.fit
    assert model is not None and state.estimable
    marginals = model.marginals()
    assert marginals is not None
    mu, v, s2 = marginals  # (S,), (S,), scalar
    waiting = np.array([(pending or {}).get(key, 0) for key in model.keys], dtype=float)  # (S,)
    v = 1 / (1 / np.maximum(v, 1e-300) + waiting / s2)
    return model.keys[int(np.argmax(knowledge_gradients(mu, v, s2)))]


def knowledge_gradients(mu: np.ndarray, v: np.ndarray, s2: float) -> np.ndarray:
    """``KG_k = E[min_j mu_j] - E[min_j mu_j after one more score of k]`` for independent normal beliefs
    ``N(mu_k, v_k)`` and a score's noise variance ``s2``, ``(S,)`` (``knowledge_gradient``'s formula)."""
    tilde = v / np.sqrt(v + s2)  # (S,)
    order = np.argsort(mu, kind="stable")
    rival = np.where(np.arange(len(mu)) == order[0], mu[order[1]], mu[order[0]])  # (S,): the best of the others
    z = -np.abs(mu - rival) / np.maximum(tilde, 1e-300)
    return tilde * (z * NORMAL.cdf(z) + NORMAL.pdf(z))
