"""The answer in one paragraph: the best shape against the baseline, how sure we are, and the tied set.

After adaptive replicates (``nas.study.adaptive``) the best shape is the posterior's pick (the
board's rank 1: the lowest shrunk loss, ``nas.stats.shrinkage``), its gain is the shrunk gain with
its 95 % posterior (credible) interval, and the tied set is the 95 % credible set of the best. A
Bayesian posterior does not need the selecting seeds left out: the shrinkage is what corrects the
selection (``benchmarks/ranking_simulation.py`` measures the coverage on known truths).

Otherwise the best shape is, after a race (``nas.study.planning``), the race's leader: the best mean over
the race's seeds among the candidates still in; otherwise the shape with the lowest mean loss
over its seeds. Its gain over the baseline is paired (common seeds,
``nas.stats.comparisons.paired_gain``) and honest about selection:

- the seeds that selected it do not enter its interval. A shape reaches the top partly because
  its first-pass seed was lucky, so that seed (its trials with role ``member`` or ``sampled``)
  is left out;
- after a race the pick was also chosen on the race's seeds, among ``m`` candidates; its
  interval is then a simultaneous one (Bonferroni: level ``1 - 0.05 / m``), which covers the
  gain of whichever candidate is picked (``benchmarks/ranking_simulation.py`` measures the
  coverage);
- after fixed replicates likewise: the pick was chosen on the replicate seeds among the ``m``
  shapes besides the baseline that received them (``replicated``), so its interval is simultaneous
  over those ``m``. Unadjusted, it covered 0.78 of known truths with the baseline among the best
  (the pick: the replicated shape whose seeds beat the baseline, partly by luck).

The summary sentence then says either

    "<shape> beats the baseline by g % (95 % CI [a, b], n paired seeds)"

when that interval lies above zero, or "no shape is distinguishable from the baseline at this
proxy budget; this study would have detected a gain of x % or more (80 % power), not a smaller
one; the tied set is ..." otherwise, the tied set being the shapes a Holm-corrected paired test
cannot tell from the best (``nas.stats.comparisons.tied_set``) and the gain the study's minimum
detectable gain (``nas.stats.resolution``): every answer says how small a gain it could have seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from nas.arch import ArchConfig
from nas.stats.adaptive import ADAPTIVE_ROLES, MIN_TAU_RATIO, AdaptiveState, adaptive_state
from nas.stats.comparisons import ALPHA, PairedGain, paired_gain, pooled_paired_sd, tied_set
from nas.stats.race import RACE_ROLES, RaceState, race_state
from nas.stats.resolution import (
    GainDesign,
    Resolution,
    allocation_limit,
    gain_design,
    posterior_resolution,
    resolution,
)
from nas.stats.shrinkage import Z
from nas.study.records import counts
from reports.frame import StudyData, outcome_counts
from reports.kv_cache import kv_cache_clause

SELECTING_ROLES = ("member", "sampled")  # the first-pass trials by which a shape entered the top of the board
TIED_NAMES_SHOWN = 5


def shape_label(data: StudyData, key: str) -> str:
    """``h=3x2,6x2,12x8 K1x256 d96 L12`` for a shape of the study (its key when the shape is unknown)."""
    for t in data.trials:
        if t.user_attrs.get("key") == key and t.user_attrs.get("arch"):
            return ArchConfig.from_dict(t.user_attrs["arch"]).label()
    return key


def selecting_seeds(data: StudyData, key: str) -> set[int]:
    """The seeds of ``key``'s first-pass trials: what selected it, and so not what may estimate its gain."""
    if key == data.baseline_key:
        return set()
    return {int(t.user_attrs.get("seed", 0)) for t in data.trials
            if t.user_attrs.get("key") == key and t.user_attrs.get("role") in SELECTING_ROLES}


def raced(data: StudyData) -> tuple[str, ...]:
    """The race's candidates (baseline first) when the study raced, else ()."""
    keys = list(dict.fromkeys(t.user_attrs["key"] for t in data.trials
                              if t.user_attrs.get("role") in RACE_ROLES and "key" in t.user_attrs))
    if not keys or data.baseline_key is None:
        return ()
    return (data.baseline_key, *(k for k in keys if k != data.baseline_key))


def race_of(data: StudyData) -> RaceState | None:
    candidates = raced(data)
    if not candidates:
        return None
    return race_state(data.scores, candidates, base_seed(data))


def base_seed(data: StudyData) -> int:
    return int((data.identity.get("train") or {}).get("seed", 0))


def allocated_adaptively(data: StudyData) -> bool:
    """Whether the study spent replicates adaptively (``nas.study.adaptive``) and has its baseline."""
    return data.baseline_key in data.scores and any(t.user_attrs.get("role") in ADAPTIVE_ROLES for t in data.trials)


def adaptive_of(data: StudyData) -> AdaptiveState | None:
    """The adaptive allocation's state (``nas.stats.adaptive``) when the study allocated adaptively, else None."""
    if not allocated_adaptively(data):
        return None
    return adaptive_state(data.scores, data.baseline_key, base_seed(data), board=data.model(),  # type: ignore[arg-type]
                          floored=data.model(MIN_TAU_RATIO))


def posterior_gain(data: StudyData, key: str) -> PairedGain | None:
    """``key``'s shrunk gain over the baseline (``nas.stats.shrinkage``) with its 95 % posterior interval (robust to
    the prior's tails), as a ``PairedGain`` (``p_value``: twice the posterior probability that the gain has the
    other sign, with the interval's mean half-width taken as the posterior sd's multiple)."""
    model = data.model()
    shrunk, base = data.gains().get(key), data.scores[data.baseline_key].mean  # type: ignore[index]
    if shrunk is None:
        return None
    interval = shrunk.interval_pct(base)
    if interval is None:
        return PairedGain(shrunk.n, -shrunk.posterior, shrunk.gain_pct(base), None, None, None, None, posterior=True)
    quantile = model.quantile if model is not None else Z
    sd = (shrunk.high - shrunk.low) / (2 * quantile) if shrunk.high is not None and shrunk.low is not None else 0.0
    p = 2 * NormalDist().cdf(-abs(shrunk.posterior) / sd) if sd > 0 else (0.0 if shrunk.posterior else 1.0)
    return PairedGain(shrunk.n, -shrunk.posterior, shrunk.gain_pct(base), interval[0], interval[1], p, None,
                      posterior=True)


def replicated(data: StudyData) -> tuple[str, ...]:
    """The shapes besides the baseline that received fixed replicates (role ``replicate``), in the order they began:
    the fixed policy's pick is chosen among them on their replicate seeds."""
    return tuple(dict.fromkeys(t.user_attrs["key"] for t in data.trials if t.user_attrs.get("role") == "replicate"
                               and "key" in t.user_attrs and t.user_attrs["key"] != data.baseline_key))


def interval_alpha(data: StudyData, key: str) -> float:
    """The two-sided level of ``key``'s gain interval: simultaneous (Bonferroni) over the race's candidates when
    ``key`` raced, over the replicated shapes when ``key`` received fixed replicates, else ``ALPHA``."""
    candidates = raced(data)
    if key in candidates:
        return ALPHA / max(1, len(candidates) - 1)
    chosen_among = replicated(data)
    return ALPHA / len(chosen_among) if key in chosen_among else ALPHA


def honest_gain(data: StudyData, key: str) -> PairedGain | None:
    """``key``'s paired gain over the baseline on the common seeds that did not select it (see the module
    docstring; simultaneous over the race's candidates or the replicated shapes: ``interval_alpha``)."""
    if data.baseline_key not in data.scores or key not in data.scores:
        return None
    # no pooled sd: the answer gives no interval on one paired seed (a pooled one ignores that the seed was chosen)
    return paired_gain(data.scores[key], data.scores[data.baseline_key], selecting_seeds(data, key),
                       alpha=interval_alpha(data, key))


def sentence_leader(data: StudyData, best: str | None) -> str | None:
    """The shape the answer's sentence compares with the baseline: ``best``, or the best shape besides the baseline
    on the board when the baseline leads; None without one."""
    if best is None or best != data.baseline_key:
        return best
    return next((key for key in data.board["key"] if key != data.baseline_key), None)


def leader_design(data: StudyData, leader: str) -> GainDesign | None:
    """How the answer's test (the shrunk gain's robust credible interval, after adaptive replicates) estimates
    ``leader``'s gain (``nas.stats.resolution.GainDesign``, its widening the leader's); None while nothing is shrunk."""
    design = gain_design(data.scores, leader, data.baseline_key, data.model(plug_in=True))  # type: ignore[arg-type]
    shrunk = data.gains().get(leader)
    if design is not None and shrunk is not None:  # the answer's interval is the robust one: its decisive end
        design = replace(design, widening=shrunk.widening)
    return design


def study_resolution(data: StudyData, best: str | None) -> Resolution | None:
    """The study's minimum detectable gain (``nas.stats.resolution``) for its leader (``sentence_leader``); None while
    it cannot be estimated."""
    if best is None or data.baseline_key not in data.scores or data.board.empty:
        return None
    leader = sentence_leader(data, best)
    if leader is None:
        return None
    if allocated_adaptively(data):  # the test is the shrunk gain's credible interval
        return posterior_resolution(leader_design(data, leader), data.scores[leader].n,
                                    data.scores[data.baseline_key].n, ALPHA, data.scores[data.baseline_key].mean)
    gain = honest_gain(data, leader)
    sd, df = pooled_paired_sd(data.scores, data.baseline_key)
    return resolution(sd, df, gain.n if gain else 0, interval_alpha(data, leader),
                      data.scores[data.baseline_key].mean)


REPLICATE_ROLES = ("replicate", "race", "confirm", "adaptive", "adaptive-confirm")  # trials after the first pass


def replicate_trials(data: StudyData) -> int:
    """The trainings the study spent after its first pass (every replicates policy's roles)."""
    return int(sum(1 for t in data.trials if t.user_attrs.get("role") in REPLICATE_ROLES and counts(t)))


def study_limit(data: StudyData, res: Resolution | None) -> Resolution | None:
    """The allocation limit (``nas.stats.resolution.allocation_limit``) at the study's own paired sd (the one its
    minimum detectable gain uses) and its replicate trials: how much of the budget the allocation used."""
    if res is None or data.baseline_key not in data.scores:
        return None
    return allocation_limit(res.sd, replicate_trials(data), ALPHA, data.scores[data.baseline_key].mean)


def resolution_text(res: Resolution | None, limit: Resolution | None = None) -> str:
    """What the study could have detected, as the clause the sentence carries, with the allocation limit."""
    if res is None:
        return ("how small a gain this study could detect is not known yet: it needs a shape with two seeds in "
                "common with the baseline, besides the one that selected it")
    bound = (f"; the allocation limit at this noise and {2 * (limit.n - 1)} replicate trials is "
             f"{limit.gain_pct:.2f} %" if limit is not None else "")
    return f"this study would have detected {res.text()}, not a smaller one ({res.needs_text()}{bound})"


def best_shape(data: StudyData) -> str | None:
    """The posterior's pick after adaptive replicates, the race's leader after a race, else the board's rank 1."""
    adaptive = adaptive_of(data)
    if adaptive is not None and adaptive.pick is not None:
        return adaptive.pick
    race = race_of(data)
    if race is not None and race.leader is not None:
        return race.leader
    return None if data.board.empty else str(data.board.iloc[0]["key"])


CREDIBLE_COLUMN = "expected gain % [95 % credible]"
PAIRED_COLUMN = "paired gain % [95 % CI], common seeds"


def board_gain_columns(data: StudyData) -> tuple[str, str]:
    """The board's two gain columns, the answer's first and marked so: after adaptive replicates the answer reads the
    shrunk gain's credible interval, after a race or fixed replicates the paired t interval; the other is shown
    per shape, not adjusted for the choice of the best."""
    if allocated_adaptively(data):
        return f"{CREDIBLE_COLUMN} (the answer's)", f"{PAIRED_COLUMN} (per shape, ignores selection)"
    return f"{PAIRED_COLUMN} (the answer's)", f"{CREDIBLE_COLUMN} (per shape)"


def gain_text(data: StudyData, key: str, gain: PairedGain | None) -> str:
    """A paired gain as text; why there is none when there is none."""
    if gain is not None:
        return gain.interval_text()
    return "-" if key == data.baseline_key else "no seed besides the one that selected it"


@dataclass
class Summary:
    """What the summary section and the dashboard note say."""

    counts: dict[str, int]
    best: str | None  # the best shape's key
    sentence: str
    gain: PairedGain | None = None  # the best shape's honest paired gain over the baseline
    tied: list[str] = field(default_factory=list)
    resolution: Resolution | None = None  # the study's minimum detectable gain
    limit: Resolution | None = None  # the allocation limit: an oracle's even split of the same replicate trials
    rows: list[dict[str, Any]] = field(default_factory=list)  # best and baseline side by side

    @property
    def beats_baseline(self) -> bool:
        """Whether the answer says the best shape beats the baseline (``above_zero`` of its gain)."""
        return above_zero(self.gain)


def above_zero(gain: PairedGain | None) -> bool:
    """Whether a gain's interval lies above zero: the answer's "beats the baseline"."""
    return gain is not None and gain.low_pct is not None and gain.low_pct > 0


def _side(data: StudyData, key: str, what: str, gain: PairedGain | None) -> dict[str, Any]:
    row = data.board[data.board["key"] == key].iloc[0]
    base = data.board[data.board["key"] == data.baseline_key]
    speed = row["tokens_per_s"]
    base_speed = base.iloc[0]["tokens_per_s"] if not base.empty else None
    return {"": what, "shape": shape_label(data, key), "seeds": int(row["seeds"]), "mean loss": row["mean_loss"],
            "± 95 % CI": row["ci95"],
            "paired gain vs baseline": gain_text(data, key, gain),
            "params": row["params"],
            "tokens/s vs baseline": speed / base_speed if speed and base_speed else None}


def summarise(data: StudyData) -> Summary:
    """The best shape, its honest gain, the tied set and the plain sentence (see the module docstring)."""
    counts = outcome_counts(data)
    if data.board.empty:
        return Summary(counts, None, "no shape has completed a training yet: nothing to compare")
    best = best_shape(data)
    race, adaptive = race_of(data), adaptive_of(data)
    # adaptive: the credible set of the best; after a race: the candidates it could not drop; else every shape a
    # paired test cannot tell from the best
    if adaptive is not None:
        tied = list(adaptive.tied)
    elif race is not None:
        tied = [best] + [key for key in race.alive if key != best]
    else:
        tied = tied_set(data.scores, best)
    names = [shape_label(data, key) for key in tied[:TIED_NAMES_SHOWN]]
    more = f" and {len(tied) - TIED_NAMES_SHOWN} more" if len(tied) > TIED_NAMES_SHOWN else ""
    tied_text = "; ".join(names) + more
    if data.baseline_key not in data.scores:
        sentence = f"the baseline has no completed training yet; the best shape so far is {shape_label(data, best)}"
        return Summary(counts, best, sentence, None, tied)
    gain = None if best == data.baseline_key else (posterior_gain(data, best) if adaptive is not None
                                                    else honest_gain(data, best))
    rows = [_side(data, best, "best", gain)] if best != data.baseline_key else []
    rows.append(_side(data, data.baseline_key, "baseline", None))
    above = _ranked_above(data, best)
    res = study_resolution(data, best)
    limit = study_limit(data, res)
    if above_zero(gain):
        seeds = f"{gain.n} seeds" if gain.posterior else f"{gain.n} paired seeds"
        sentence = (f"{shape_label(data, best)} beats the baseline by {gain.gain_pct:.2f} % "
                    f"({gain.interval_name} [{gain.low_pct:.2f}, {gain.high_pct:.2f}], {seeds}"
                    + (f"; minimum detectable gain {res.gain_pct:.2f} %" if res is not None else "")
                    + (f", allocation limit {limit.gain_pct:.2f} %)" if limit is not None else ")"))
    elif best == data.baseline_key:
        lead = (f"the baseline leads the race of the {len(race.candidates) - 1} best shapes"
                if race is not None else "the baseline has the lowest expected loss" if adaptive is not None
                else "the baseline has the lowest loss")
        sentence = (f"no shape beats the baseline at this proxy budget: {lead}; {resolution_text(res, limit)}; "
                    f"the tied set is {tied_text}")
    else:
        sentence = (f"no shape is distinguishable from the baseline at this proxy budget; "
                    f"{resolution_text(res, limit)}; "
                    f"the tied set is {tied_text}")
    if above:
        sentence += f" ({len(above)} shape{'s' if len(above) > 1 else ''} above it in the leaderboard " + (
            "rest on fewer seeds and were not raced)" if race is not None and not set(above) & set(race.candidates)
            else "rest on fewer seeds)")
    sentence += kv_cache_clause(data, tied)  # grouped-query studies: the cheapest shape tied with the best
    return Summary(counts, best, sentence, gain, tied, rows=rows, resolution=res, limit=limit)


def _ranked_above(data: StudyData, key: str) -> list[str]:
    """The leaderboard rows above ``key``: after a race, unraced shapes on one seed can rank above its leader."""
    position = data.board.index[data.board["key"] == key]
    return list(data.board["key"].iloc[:int(position[0])]) if len(position) else []

