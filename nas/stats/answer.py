"""The answer of a study, built once: the best shape against the baseline, how sure, what is tied, and the rules.

Every place that states the answer (the search's last line, ``nas best``, the report, the dashboard note) renders
this one value (``reports.summary``) and computes nothing of its own (as statsmodels' results object is fitted once
and only read by its summaries). It is a function of the study's ``Evidence`` (``nas.stats.evidence``) and, for the
design rules, of each shape's covariates (``RuleInputs``).

**The best shape.** After adaptive replicates (``nas.study.adaptive``) it is the posterior's pick (the board's rank
1: the lowest shrunk loss, ``nas.stats.shrinkage``), its gain the shrunk gain with its 95 % posterior (credible)
interval, and the tied set the 95 % credible set of the best. A Bayesian posterior does not need the selecting seeds
left out: the shrinkage is what corrects the selection (``benchmarks/ranking_simulation.py`` measures the coverage on
known truths). Otherwise, after a race (``nas.study.planning``), it is the race's leader (the best mean over the
race's seeds among the candidates still in), else the board's rank 1, and its gain over the baseline is paired
(common seeds, ``nas.stats.comparisons.paired_gain``) and honest about selection:

- the seeds that selected it do not enter its interval (a shape reaches the top partly because its first-pass seed
  was lucky: its trials with role ``member`` or ``sampled`` are left out);
- after a race the pick was also chosen on the race's seeds, among ``m`` candidates; its interval is then a
  simultaneous one (Bonferroni, ``1 - 0.05 / m``), which covers the gain of whichever candidate is picked;
- after fixed replicates likewise, over the ``m`` shapes besides the baseline that received them (unadjusted, the
  interval covered 0.78 of known truths with the baseline among the best).

**The verdict** is ``beats`` when that interval lies above zero, else ``baseline leads`` (the baseline is the pick)
or ``not distinguishable``; each carries the study's minimum detectable gain (``nas.stats.resolution``) and the
allocation limit, so every answer says how small a gain it could have seen. For a grouped-query study the answer also
names the cheapest shape tied with the best (the smallest KV cache).

**The rules** (``nas.stats.rules``) are fitted to every run of the study, and to each longer budget's re-runs
(``nas rules --confirm``), so that each rule is stated with its fidelity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from nas.stats.comparisons import ALPHA, PairedGain, pooled_paired_sd, tied_set
from nas.stats.evidence import Evidence
from nas.stats.resolution import (
    GainDesign,
    Resolution,
    allocation_limit,
    gain_design,
    posterior_resolution,
    resolution,
)
from nas.stats.rule_checks import fidelity, selection_imbalance
from nas.stats.rules import RuleEstimate, RuleFit, fit_rules
from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import Z

BEATS, BASELINE_LEADS, NOT_DISTINGUISHABLE = "beats", "baseline leads", "not distinguishable"
EMPTY, NO_BASELINE = "no trainings", "no baseline"


@dataclass(frozen=True)
class Budget:
    """A longer budget's re-runs of the study's shapes (``nas rerun`` or ``nas rules --confirm``): their scores by
    the proxy shape's key, and the label of the preset they were trained at."""

    label: str
    scores: dict[str, ShapeScores]


@dataclass(frozen=True)
class RuleInputs:
    """What the rule model needs besides the scores: the rules to read, each shape's covariates (one value a rule,
    by shape key), and the longer budgets to read them at."""

    names: tuple[str, ...]
    covariates: Mapping[str, Sequence[float]]
    budgets: tuple[Budget, ...] = ()
    squares: Mapping[str, str] = field(default_factory=dict)  # a rule that squares another -> that rule (the U)
    left_out: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # "pruned", "failed" -> their shapes' keys


@dataclass(frozen=True)
class RuleCheck:
    """One rule at one longer budget: its estimate there and how it fared against the proxy's (``fidelity``)."""

    budget: str
    estimate: RuleEstimate
    verdict: str  # held | shrank | reversed | not resolved


@dataclass(frozen=True)
class RuleAnswer:
    """The rules at the proxy and at every longer budget the study was re-run at."""

    proxy: RuleFit | None
    budgets: tuple[tuple[str, RuleFit | None], ...] = ()
    left_out: dict[str, int] = field(default_factory=dict)  # trials the proxy's fit could not read, by why
    leaning: dict[str, float] = field(default_factory=dict)  # rules whose left-out shapes differ: name -> p value

    def checks(self, name: str) -> tuple[RuleCheck, ...]:
        """``name`` at each longer budget with a fit, against the proxy."""
        if self.proxy is None:
            return ()
        return tuple(RuleCheck(label, fit.estimate(name), fidelity(self.proxy.estimate(name), fit.estimate(name)))
                     for label, fit in self.budgets if fit is not None and name in fit.names)


@dataclass(frozen=True)
class Answer:
    """What a study found (module docstring); ``reports.summary`` renders it."""

    verdict: str  # beats | baseline leads | not distinguishable | no trainings | no baseline
    best: str | None = None  # the best shape's key
    leader: str | None = None  # the shape the sentence compares with the baseline (the best, or the runner-up)
    gain: PairedGain | None = None  # the best shape's gain over the baseline: credible after adaptive replicates
    tied: tuple[str, ...] = ()  # the shapes the study cannot tell from the best, the best first
    resolution: Resolution | None = None  # the study's minimum detectable gain
    limit: Resolution | None = None  # the allocation limit: an oracle's even split of the same replicate trials
    above: tuple[str, ...] = ()  # the board's rows above the best (unraced shapes on fewer seeds)
    policy: str = "plain"  # adaptive | race | fixed | plain: how the replicates were spent
    race_candidates: tuple[str, ...] = ()
    cheapest: str | None = None  # the tied shape with the smallest KV cache (grouped-query studies)
    rules: RuleAnswer | None = None

    @property
    def beats_baseline(self) -> bool:
        return self.verdict == BEATS


def above_zero(gain: PairedGain | None) -> bool:
    """Whether a gain's interval lies above zero: the answer's "beats the baseline"."""
    return gain is not None and gain.low_pct is not None and gain.low_pct > 0


def posterior_gain(evidence: Evidence, key: str) -> PairedGain | None:
    """``key``'s shrunk gain over the baseline with its 95 % posterior interval (robust to the prior's tails), as a
    ``PairedGain`` (``p_value``: twice the posterior probability that the gain has the other sign, with the interval's
    mean half-width taken as the posterior sd's multiple)."""
    model, shrunk, base = evidence.model(), evidence.gains().get(key), evidence.baseline_loss
    if shrunk is None or base is None:
        return None
    interval = shrunk.interval_pct(base)
    if interval is None:
        return PairedGain(shrunk.n, -shrunk.posterior, shrunk.gain_pct(base), None, None, None, None, posterior=True)
    quantile = model.quantile if model is not None else Z
    sd = (shrunk.high - shrunk.low) / (2 * quantile) if shrunk.high is not None and shrunk.low is not None else 0.0
    p = 2 * NormalDist().cdf(-abs(shrunk.posterior) / sd) if sd > 0 else (0.0 if shrunk.posterior else 1.0)
    return PairedGain(shrunk.n, -shrunk.posterior, shrunk.gain_pct(base), interval[0], interval[1], p, None,
                      posterior=True)


def best_shape(evidence: Evidence) -> str | None:
    """The posterior's pick after adaptive replicates, the race's leader after a race, else the board's rank 1."""
    adaptive = evidence.adaptive_state()
    if adaptive is not None and adaptive.pick is not None:
        return adaptive.pick
    race = evidence.race()
    if race is not None and race.leader is not None:
        return race.leader
    order = evidence.ranking().order
    return order[0] if order else None


def sentence_leader(evidence: Evidence, best: str | None) -> str | None:
    """The shape the answer compares with the baseline: ``best``, or the best other shape on the board when the
    baseline leads; None without one."""
    if best is None or best != evidence.baseline_key:
        return best
    return next((key for key in evidence.ranking().order if key != evidence.baseline_key), None)


def leader_design(evidence: Evidence, leader: str) -> GainDesign | None:
    """How the answer's test (the shrunk gain's robust credible interval, after adaptive replicates) estimates
    ``leader``'s gain (``nas.stats.resolution.GainDesign``, its widening the leader's); None while nothing is shrunk."""
    design = gain_design(evidence.scores, leader, evidence.baseline_key,  # type: ignore[arg-type]
                         evidence.model(plug_in=True))
    shrunk = evidence.gains().get(leader)
    if design is not None and shrunk is not None:  # the answer's interval is the robust one: its decisive end
        design = replace(design, widening=shrunk.widening)
    return design


def study_resolution(evidence: Evidence, best: str | None) -> Resolution | None:
    """The study's minimum detectable gain (``nas.stats.resolution``) for its leader; None while it cannot be
    estimated."""
    if best is None or not evidence.has_baseline:
        return None
    leader = sentence_leader(evidence, best)
    if leader is None:
        return None
    base = evidence.scores[evidence.baseline_key]  # type: ignore[index]
    if evidence.adaptive:  # the test is the shrunk gain's credible interval
        return posterior_resolution(leader_design(evidence, leader), evidence.scores[leader].n, base.n, ALPHA,
                                    base.mean)
    gain = evidence.honest_gain(leader)
    sd, df = pooled_paired_sd(evidence.scores, evidence.baseline_key)  # type: ignore[arg-type]
    return resolution(sd, df, gain.n if gain else 0, evidence.interval_alpha(leader), base.mean)


def study_limit(evidence: Evidence, res: Resolution | None) -> Resolution | None:
    """The allocation limit (``nas.stats.resolution.allocation_limit``) at the study's own paired sd and its
    replicate trials: how much of the budget the allocation used."""
    if res is None or evidence.baseline_loss is None:
        return None
    return allocation_limit(res.sd, evidence.replicate_trials(), ALPHA, evidence.baseline_loss)


def cheapest_tied(tied: Sequence[str], kv_bytes: Mapping[str, int], order: Sequence[str]) -> str | None:
    """Among ``tied``, the shape with the smallest KV cache (the better ranked on equal caches); None unless the
    study trained grouped shapes (``kv_bytes`` given)."""
    rank = {key: i for i, key in enumerate(order)}
    known = [key for key in tied if key in kv_bytes and key in rank]
    return min(known, key=lambda key: (kv_bytes[key], rank[key])) if known else None


def rule_answer(evidence: Evidence, inputs: RuleInputs) -> RuleAnswer:
    """The rule model at the proxy and at each longer budget (its own baseline's loss there)."""
    proxy = fit_rules(evidence.scores, inputs.covariates, inputs.names, evidence.baseline_loss, inputs.squares)
    at = {e.name: e.at for e in proxy.estimates if e.at is not None} if proxy is not None else {}
    budgets = []
    for budget in inputs.budgets:  # a U's slope read where the proxy read it
        base = budget.scores.get(evidence.baseline_key or "")
        budgets.append((budget.label, fit_rules(budget.scores, inputs.covariates, inputs.names,
                                                base.mean if base is not None else None, inputs.squares, at)))
    left = [key for keys in inputs.left_out.values() for key in keys]
    leaning = selection_imbalance(inputs.covariates, list(evidence.scores), left, inputs.names) if left else {}
    return RuleAnswer(proxy, tuple(budgets), {why: len(keys) for why, keys in inputs.left_out.items() if keys},
                      leaning)


def build_answer(evidence: Evidence, rules: RuleInputs | None = None,
                 kv_bytes: Mapping[str, int] | None = None) -> Answer:
    """The study's ``Answer`` (module docstring). ``kv_bytes``: each shape's KV cache, for a grouped-query study."""
    rule_part = rule_answer(evidence, rules) if rules is not None else None
    order = evidence.ranking().order
    if not order:
        return Answer(EMPTY, rules=rule_part)
    best = best_shape(evidence)
    race, adaptive = evidence.race(), evidence.adaptive_state()
    # adaptive: the credible set of the best; after a race: the candidates it could not drop; else every shape a
    # paired test cannot tell from the best
    if adaptive is not None:
        tied = tuple(adaptive.tied)
    elif race is not None:
        tied = (best, *(key for key in race.alive if key != best))  # type: ignore[assignment]
    else:
        tied = tuple(tied_set(evidence.scores, best))  # type: ignore[arg-type]
    policy = "adaptive" if adaptive is not None else "race" if race is not None else \
        "fixed" if evidence.replicated() else "plain"
    common = {"best": best, "tied": tied, "policy": policy, "rules": rule_part,
              "race_candidates": race.candidates if race is not None else (),
              "cheapest": cheapest_tied(tied, kv_bytes, order) if kv_bytes else None}
    if not evidence.has_baseline:
        return Answer(NO_BASELINE, **common)
    gain = None if best == evidence.baseline_key else (
        posterior_gain(evidence, best) if adaptive is not None else evidence.honest_gain(best))  # type: ignore[arg-type]
    res = study_resolution(evidence, best)
    verdict = BEATS if above_zero(gain) else BASELINE_LEADS if best == evidence.baseline_key else NOT_DISTINGUISHABLE
    position = order.index(best) if best in order else 0
    return Answer(verdict, leader=sentence_leader(evidence, best), gain=gain, resolution=res,
                  limit=study_limit(evidence, res), above=tuple(order[:position]), **common)
