"""The adaptive allocation's statistics, as pure functions of the scores: the knowledge gradient on the shrunk
posterior, the pick, every shape's probability of being the best, and the credible tied set.

Read by the planner (``nas.study.adaptive`` decides which shape trains next from them) and by the report
(``reports.summary``: the pick, its tied set and its interval), so both read one state from the same trials.
The procedure, its warm-up and stopping rule are described in ``nas.study.adaptive``.

The probabilities come from ``DRAWS`` joint posterior draws with a generator seeded by the study's
base seed and its number of scores, so a study's state is reproducible from its trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from nas.stats.board import rank_shapes
from nas.stats.comparisons import ALPHA
from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import Fit, fit

ADAPTIVE_ROLES = ("adaptive", "adaptive-confirm")
DRAWS = 4000  # joint posterior draws for the report's probabilities of being the best (fewer for large spaces)
PLANNING_DRAWS = 1000  # the planner's: enough to tell P(best) >= 0.95 to about +-0.007
MIN_TAU_RATIO = 0.1  # the allocation's floor on tau / sigma (nas.stats.shrinkage.fit): keeps exploring at tau^ = 0


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
                   draws: int = DRAWS, plug_in: bool = False, board: Fit | None = None,
                   floored: Fit | None = None) -> AdaptiveState:
    """The pick (the board's rank 1: ``nas.stats.board.rank_shapes``), P(best) per shape and the credible set.

    ``board``: the board's fit (``fit(scores, baseline=baseline)``) and ``floored``: ``fit(scores, MIN_TAU_RATIO,
    plug_in)``, when the caller has them already (a reader fits each once). The floored fit, which the knowledge
    gradient and P(best) read, keeps the baseline a member of the pack: as a fixed effect (the board's) its posterior
    variance ``s2 / n_base`` dwarfs a shrunk shape's, and the knowledge gradient gave it 65 of 71 replicate trials on
    known truths with the baseline among the best (the leader 2); the tied set drawn from it covered the true best in
    0.87 of those studies, from the member fit 0.95."""
    if not scores:
        return AdaptiveState(None, {}, (), None)
    pick = rank_shapes(scores, baseline, board, intervals=False).order[0]
    model = floored if floored is not None else fit(scores, MIN_TAU_RATIO, plug_in=plug_in)
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


def knowledge_gradient(state: AdaptiveState, pending: dict[str, int] | None = None,
                       bonus: dict[str, float] | None = None) -> str:
    """The shape whose next score is expected to lower the best posterior mean the most (module docstring).

    Frazier, Powell and Dayanik, "A knowledge-gradient policy for sequential information collection" (SIAM J.
    Control Optim. 2008), for minimisation, on every shape's posterior marginal ``N(mu_k, v_k)`` and a score's
    noise ``s2``::

        sigma~_k = v_k / sqrt(v_k + s2)              (the sd of mu_k's change after one more score)
        KG_k = sigma~_k f(-|mu_k - min_{j != k} mu_j| / sigma~_k),   f(z) = z Phi(z) + phi(z)

    ``pending``: shape -> trainings in flight; each counts as a score already taken (``v_k`` shrunk by it, the
    mean unchanged), so workers that plan at once spread over shapes instead of lining up on one. ``bonus``: shape ->
    nats a trial of it is worth besides ``KG_k`` (``nas.study.adaptive.answer_value``), added before the argmax."""
    model = state.fit
    assert model is not None and state.estimable
    marginals = model.marginals()
    assert marginals is not None
    mu, v, s2 = marginals  # (S,), (S,), scalar
    waiting = np.array([(pending or {}).get(key, 0) for key in model.keys], dtype=float)  # (S,)
    v = 1 / (1 / np.maximum(v, 1e-300) + waiting / s2)
    extra = np.array([(bonus or {}).get(key, 0.0) for key in model.keys])  # (S,)
    return model.keys[int(np.argmax(knowledge_gradients(mu, v, s2) + extra))]


def knowledge_gradients(mu: np.ndarray, v: np.ndarray, s2: float) -> np.ndarray:
    """``KG_k = E[min_j mu_j] - E[min_j mu_j after one more score of k]`` for independent normal beliefs
    ``N(mu_k, v_k)`` and a score's noise variance ``s2``, ``(S,)`` (``knowledge_gradient``'s formula)."""
    tilde = v / np.sqrt(v + s2)  # (S,)
    order = np.argsort(mu, kind="stable")
    rival = np.where(np.arange(len(mu)) == order[0], mu[order[1]], mu[order[0]])  # (S,): the best of the others
    z = -np.abs(mu - rival) / np.maximum(tilde, 1e-300)
    return tilde * (z * ndtr(z) + np.exp(-z * z / 2) / math.sqrt(2 * math.pi))  # z Phi(z) + phi(z)
