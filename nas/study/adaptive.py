"""Adaptive replicates after an exhaustive walk: the knowledge gradient on the shrunk posterior.

Pure functions of the stored scores (no storage, no torch), shared by the planner (which shape to
train next, ``nas.study.planning``) and the report (the pick, its tied set and its interval,
``reports.summary``), so both read one state from the same trials. ``--replicates adaptive``:

- **the posterior.** Every stored score enters the two-way random-effects model of
  ``nas.stats.shrinkage`` (``L = shape level + seed effect + noise``; the shape levels' prior
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

``--replicates adaptive-answer`` weighs the answer's sentence against the pick in one currency, nats: the next
trial goes to the shape that maximises ``KG_k`` plus, for the sentence's subject (the pick, or the best other
shape when the baseline is the pick), ``answer_value``: how many nats one more trial of it lowers the minimum
detectable gain of its comparison with the baseline (the baseline's seed in pace counted as part of its cost).
On known truths as flat as the real space (true-mean sd 0.023 nats, paired sd 0.129; 300 studies, 71 replicate
trials) it brought the minimum detectable gain from a median 2.00x to 1.27x the allocation limit and picked the
true best in 0.060 of the studies against the default's 0.130; at figure 10's truth (sd 0.060; 500 studies a row)
its ratio was 1.05 against 1.61 and it picked the true best in 0.340 against 0.470: the seeds it gives the
sentence are seeds the pick lacks. Opt-in for that reason: the default is for finding the pick, this one for a
space where the pick cannot be found and the comparison with the baseline is the question
(``benchmarks/ranking_simulation.py --policies adaptive-answer``; docs/concepts/proxy.md).
"""

from __future__ import annotations

import math

from nas.stats.adaptive import PLANNING_DRAWS, AdaptiveState, adaptive_state, knowledge_gradient
from nas.stats.board import rank_shapes
from nas.stats.comparisons import ALPHA
from nas.stats.resolution import gain_design, posterior_resolution
from nas.stats.scores import ShapeScores

WARMUP = 4  # first-pass best shapes that, with the baseline, open the second seed
# the baseline trains whenever it has fewer than this many times the pick's seeds (in flight included): the
# answer's sentence compares the two, and its interval is set by the scarcer of them (module docstring)
BASELINE_PACE = 1.0


def warmup_shapes(scores: dict[str, ShapeScores], baseline: str) -> tuple[str, ...]:
    """The baseline and the ``WARMUP`` best shapes of the board (the shrunk ranking every reader shows): the second
    seed's shapes."""
    others = [k for k in rank_shapes(scores, baseline, intervals=False).order if k != baseline]
    return (baseline, *others[:WARMUP]) if baseline in scores else tuple(others[:WARMUP + 1])


def sentence_subject(state: AdaptiveState, baseline: str) -> str | None:
    """The shape the answer's sentence compares with the baseline: the pick, or, when the baseline is the pick, the
    shape with the lowest posterior mean besides it (the report's leader, ``reports.summary.study_resolution``)."""
    if state.pick != baseline or state.fit is None:
        return state.pick
    marginals = state.fit.marginals()
    if marginals is None:  # nothing shrunk: no posterior order to read
        return state.pick
    others = [(mu, key) for mu, key in zip(marginals[0], state.fit.keys) if key != baseline]
    return min(others)[1] if others else None


def answer_value(scores: dict[str, ShapeScores], state: AdaptiveState, subject: str, baseline: str,
                 trained: dict[str, set[int]]) -> float:
    """Nats per trial by which one more seed of ``subject`` (the sentence's shape: ``sentence_subject``) and one of
    the baseline, when it would then lag, lower the minimum detectable gain ``MDG`` of the subject's gain interval
    (``nas.stats.resolution.posterior_resolution``)::

        value = MDG * (1 - sqrt(q' / q)) / trials,   q = 1/n + 1/n_b,   q' = 1/(n + 1) + 1/n_b'

    with ``n``, ``n_b`` the subject's and the baseline's seeds (in flight included), ``n_b' = n_b + 1`` when the
    baseline would lag (then ``trials`` = 2) and ``n_b`` otherwise (``trials`` = 1): the interval's width goes as
    ``sqrt(q)`` on common seeds. 0 for the baseline itself or while the sentence has no interval."""
    if subject == baseline or baseline not in scores or subject not in scores or state.fit is None:
        return 0.0
    n, n_b = len(trained.get(subject, ())), len(trained.get(baseline, ()))
    if n < 1 or n_b < 1:
        return 0.0
    resolved = posterior_resolution(gain_design(scores, subject, baseline, state.fit), n, n_b, ALPHA, 1.0)
    if resolved is None:  # the shrinkage keeps nothing of a gain
        return 0.0
    n_b_next = n_b + 1 if n_b < n + 1 else n_b
    q, q_next = 1 / n + 1 / n_b, 1 / (n + 1) + 1 / n_b_next
    return resolved.gain * (1 - math.sqrt(q_next / q)) / (2 if n_b_next > n_b else 1)


def next_shape(scores: dict[str, ShapeScores], baseline: str, base_seed: int,
               trained: dict[str, set[int]], pace: float = BASELINE_PACE, answer: bool = False) -> tuple[str, str]:
    """(shape, role) to train next; ``trained`` maps a shape to the seeds it has trained, is training or has queued.

    Warm-up shapes missing the second seed first; then, once the pick is settled, the pick and the baseline
    alternately (fewest seeds first); else the baseline when it has fewer than ``pace`` times the pick's seeds
    (the sentence compares the two: ``BASELINE_PACE``); else the knowledge gradient (its ``pending``: the seeds in
    ``trained`` without a score, in flight or failed). "The pick" in the pace and confirm rules is the sentence's
    subject (``sentence_subject``: the pick, or the best other shape when the baseline is the pick): with the pick the
    baseline itself, nothing else would keep the baseline in pace with the shape the sentence compares it with. With
    ``answer`` (``--replicates adaptive-answer``) the subject also gets its ``answer_value`` added to its knowledge
    gradient. ``pace`` 0 is the allocation for the pick alone."""
    second = base_seed + 1
    waiting = [k for k in warmup_shapes(scores, baseline) if second not in trained.get(k, set())]
    if waiting:
        return waiting[0], "adaptive"
    state = adaptive_state(scores, baseline, base_seed, PLANNING_DRAWS, plug_in=True)
    pending = {k: len(seeds - set(scores[k].seeds)) for k, seeds in trained.items() if k in scores}
    if not state.estimable:  # the warm-up is in flight: the shape with the fewest seeds among its shapes
        warmup = warmup_shapes(scores, baseline)  # empty while no shape has a score (more workers than members)
        return min(warmup or (baseline,), key=lambda k: len(trained.get(k, ()))), "adaptive"
    subject = sentence_subject(state, baseline)
    if state.settled and state.pick is not None:
        pair = [k for k in (subject or state.pick, baseline) if k in scores]
        return min(pair, key=lambda k: (len(trained.get(k, ())), pair.index(k))), "adaptive-confirm"
    if pace > 0 and subject not in (None, baseline) and baseline in scores \
            and len(trained.get(baseline, ())) < pace * len(trained.get(subject, ())):  # type: ignore[arg-type]
        return baseline, "adaptive"
    bonus = {subject: answer_value(scores, state, subject, baseline, trained)} if answer and subject else None
    return knowledge_gradient(state, pending, bonus), "adaptive"


