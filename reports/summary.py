"""The answer in words (``nas.stats.answer.Answer``, built once a snapshot): what the search's last line, ``nas best``,
the report and the dashboard note say. Nothing here computes a statistic; it only renders.

The first sentence reads in one breath: the verdict and the study's resolution, e.g.

    "No shape beats the baseline at this proxy: the study would have detected a gain of 3.01 % (0.091 nats) or
    more (80 % power)."

    "h=3x2,12x10 K1x256 d96 L12 beats the baseline by 2.41 % (95 % credible interval [0.30, 4.52], 16 seeds;
    minimum detectable gain 3.01 %)."

Then the particulars (what the power is of, the seeds a smaller gain needs, the allocation limit, the tied set as a
count and where the leaderboard marks it) and one sentence per design rule the study resolved
(``reports.rule_text``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nas.arch import ArchConfig
from nas.stats.answer import BASELINE_LEADS, BEATS, EMPTY, NO_BASELINE, Answer
from nas.stats.comparisons import PairedGain
from nas.stats.resolution import Resolution
from reports.frame import StudyData, outcome_counts
from reports.rule_text import resolved_sentences
from search_spaces.base import Rule

CREDIBLE_COLUMN = "expected gain % [95 % credible]"
PAIRED_COLUMN = "paired gain % [95 % CI], common seeds"
TIED_COLUMN = "tied"


def shape_label(data: StudyData, key: str) -> str:
    """``h=3x2,6x2,12x8 K1x256 d96 L12`` for a shape of the study (its key when the shape is unknown)."""
    for t in data.trials:
        if t.user_attrs.get("key") == key and t.user_attrs.get("arch"):
            return ArchConfig.from_dict(t.user_attrs["arch"]).label()
    return key


def board_gain_columns(data: StudyData) -> tuple[str, str]:
    """The board's two gain columns, the answer's first and marked so: after adaptive replicates the answer reads the
    shrunk gain's credible interval, after a race or fixed replicates the paired t interval; the other is shown
    per shape, not adjusted for the choice of the best."""
    if data.evidence.adaptive:
        return f"{CREDIBLE_COLUMN} (the answer's)", f"{PAIRED_COLUMN} (per shape, ignores selection)"
    return f"{PAIRED_COLUMN} (the answer's)", f"{CREDIBLE_COLUMN} (per shape)"


def gain_text(data: StudyData, key: str, gain: PairedGain | None) -> str:
    """A paired gain as text; why there is none when there is none."""
    if gain is not None:
        return gain.interval_text()
    return "-" if key == data.baseline_key else "no seed besides the one that selected it"


def failures_text(data: StudyData) -> str:
    """``3 diverged, 1 out of memory``: the trainings that ended with a result but no score; empty when none."""
    counts = outcome_counts(data)
    return ", ".join(f"{n} {what.removeprefix('failed (').removesuffix(')')}" for what, n in counts.items()
                     if what.startswith("failed (") and n)


def baseline_failed(data: StudyData) -> str | None:
    """How the baseline's trainings ended when none of them has a score (``diverged``), else None."""
    frame = data.frame
    if frame.empty or data.baseline_key is None or data.baseline_key in data.scores:
        return None
    statuses = frame.loc[(frame["key"] == data.baseline_key) & frame["status"].notna(), "status"]
    failed = sorted({str(s) for s in statuses if s not in ("ok", "interrupted", "unreadable")})
    return " and ".join(failed) or None


def lead_sentence(data: StudyData, answer: Answer) -> str:
    """The verdict and the resolution, in one short sentence (module docstring)."""
    if answer.verdict == EMPTY:
        failed = failures_text(data)
        if failed:  # every training ended, none with a score: not "yet"
            return f"No shape has a score: every training that ended failed ({failed}); nothing to compare."
        return "No shape has completed a training yet: nothing to compare."
    if answer.verdict == NO_BASELINE:
        best = shape_label(data, answer.best)  # type: ignore[arg-type]
        failed = baseline_failed(data)
        if failed:
            return f"The baseline's training {failed}, so no gain over it can be read; the best shape is {best}."
        return f"The baseline has no completed training yet; the best shape so far is {best}."
    if len(data.scores) == 1:  # the baseline alone: it cannot lead a comparison that has not begun
        return "Only the baseline has completed a training: no other shape to compare with it yet."
    res = answer.resolution
    if answer.verdict == BEATS:
        gain = answer.gain
        assert gain is not None
        seeds = f"{gain.n} seeds" if gain.posterior else f"{gain.n} paired seeds"
        mdg = f"; minimum detectable gain {res.gain_pct:.2f} %" if res is not None else ""
        return (f"{shape_label(data, answer.best)} beats the baseline by {gain.gain_pct:.2f} % "  # type: ignore[arg-type]
                f"({gain.interval_name} [{gain.low_pct:.2f}, {gain.high_pct:.2f}], {seeds}{mdg}).")
    head = ("No shape beats the baseline at this proxy" if answer.verdict == BASELINE_LEADS
            else "No shape is distinguishable from the baseline at this proxy")
    if res is None:
        return f"{head}; how small a gain this study could detect is not known yet."
    return f"{head}: this study would have detected {res.short_text()}, not a smaller one."


def detail_sentences(data: StudyData, answer: Answer) -> str:
    """The particulars behind the first sentence: the resolution's design, the seeds a smaller gain needs, the
    allocation limit, the tied set as a count, the board's rows above the best, the cheapest tied shape."""
    out = []
    res, limit = answer.resolution, answer.limit
    if answer.verdict in (EMPTY, NO_BASELINE) or len(data.scores) == 1:
        return ""
    if res is not None:
        bound = (f"; the allocation limit at this noise and {2 * (limit.n - 1)} replicate trials is "
                 f"{limit.gain_pct:.2f} %" if limit is not None else "")
        out.append(f"Resolution: {res.power_text()}; {res.needs_text()}{bound}.")
    elif answer.verdict != BEATS:
        out.append("It needs a shape with two seeds in common with the baseline, besides the one that selected it: "
                   "the search replicates once it has walked every member of the space (--trials at least `nas space "
                   "count` with the same options), or `nas rerun --seeds 2` trains the best again.")
    if answer.verdict == BASELINE_LEADS:
        lead = (f"The baseline leads the race of the {len(answer.race_candidates) - 1} best shapes"
                if answer.policy == "race" else "The baseline has the lowest expected loss"
                if answer.policy == "adaptive" else "The baseline has the lowest loss")
        out.append(f"{lead}.")
    others = len(answer.tied) - 1
    if others > 0:
        out.append(f"{others} other shape{'s are' if others > 1 else ' is'} tied with the best (the leaderboard's "
                   f"'{TIED_COLUMN}' column).")
    if answer.above:
        out.append(above_sentence(data, answer))
    if answer.cheapest is not None:
        out.append(kv_sentence(data, answer.cheapest))
    failed = {what.removeprefix("failed (").removesuffix(")"): n for what, n in outcome_counts(data).items()
              if what.startswith("failed (") and n}
    if failed:  # a proxy that diverges on some shapes leaves them out: the answer says so, not only the counts
        parts = ", ".join(f"{n} {why}" for why, n in sorted(failed.items()))
        out.append(f"Left out of the board: {parts} (recorded as failures; their shapes have no score here).")
    return " ".join(out)


def above_sentence(data: StudyData, answer: Answer) -> str:
    """Why the board's rows above the best are not the answer: fewer seeds (and, after a race, not raced), or, after a
    race, the board's shrunk expected gain ranking them higher where the race picked the best by its paired gain on
    the race's common seeds. It said "rest on fewer seeds" of rows with as many seeds as the best, or more."""
    seeds = {key: len(data.scores[key].seeds) for key in (*answer.above, answer.best) if key in data.scores}
    own = seeds.get(answer.best or "", 0)
    fewer = [key for key in answer.above if seeds.get(key, 0) < own]
    parts = []
    if fewer:
        unraced = answer.policy == "race" and not set(fewer) & set(answer.race_candidates)
        many = len(fewer) > 1
        parts.append(f"{len(fewer)} shape{'s' if many else ''} above it in the leaderboard "
                     f"{'rest' if many else 'rests'} on fewer seeds"
                     + (f" and {'were' if many else 'was'} not raced" if unraced else ""))
    others = len(answer.above) - len(fewer)
    if others:
        how = (": the race picked it by its paired gain on the race's common seeds" if answer.policy == "race"
               else "")
        parts.append(f"{others} shape{'s' if others > 1 else ''} with as many seeds or more "
                     f"{'rank' if others > 1 else 'ranks'} above it on the leaderboard's shrunk expected gain{how}")
    return "; ".join(parts) + "."


def kv_sentence(data: StudyData, key: str) -> str:
    """``The cheapest shape tied with the best is h=... kv=...: 128 bytes of KV cache per token, 25 % of the
    baseline's 512.`` (grouped-query studies)."""
    archs = data.archs()
    cheapest, base = archs[key], archs.get(data.baseline_key or "")
    own = cheapest.kv_cache_bytes_per_token()
    share = ""
    if base is not None:
        base_bytes = base.kv_cache_bytes_per_token()
        share = (f", {100 * own / base_bytes:.0f} % of the baseline's {base_bytes:,}" if own != base_bytes
                 else ", as much as the baseline")
    return f"The cheapest shape tied with the best is {cheapest.label()}: {own:,} bytes of KV cache per token{share}."


@dataclass
class Summary:
    """The answer rendered: its first sentence, the particulars, the rule sentences, and best and baseline side by
    side; ``answer`` is the value they render."""

    answer: Answer
    counts: dict[str, int]
    sentence: str  # the verdict and its resolution, one short sentence
    detail: str = ""  # the particulars (detail_sentences)
    rule_sentences: list[str] = field(default_factory=list)  # one per rule the study resolved
    rows: list[dict[str, Any]] = field(default_factory=list)  # best and baseline side by side

    @property
    def best(self) -> str | None:
        return self.answer.best

    @property
    def gain(self) -> PairedGain | None:
        return self.answer.gain

    @property
    def tied(self) -> list[str]:
        return list(self.answer.tied)

    @property
    def resolution(self) -> Resolution | None:
        return self.answer.resolution

    @property
    def limit(self) -> Resolution | None:
        return self.answer.limit

    @property
    def beats_baseline(self) -> bool:
        return self.answer.beats_baseline

    @property
    def text(self) -> str:
        """The first sentence and the particulars."""
        return f"{self.sentence} {self.detail}".strip()

    @property
    def rules_text(self) -> str:
        """The resolved rules, one sentence each (what the search's last line and ``nas best`` add)."""
        if not self.rule_sentences:
            return ""
        return "Design rules: " + "; ".join(s[0].upper() + s[1:] + "." for s in self.rule_sentences)


GAIN_COLUMN = "the answer's gain vs baseline"  # the paired gain, or after adaptive replicates the expected gain


def _side(data: StudyData, key: str, what: str, gain: PairedGain | None) -> dict[str, Any]:
    row = data.board[data.board["key"] == key].iloc[0]
    base = data.board[data.board["key"] == data.baseline_key]
    speed = row["tokens_per_s"]
    base_speed = base.iloc[0]["tokens_per_s"] if not base.empty else None
    return {"": what, "shape": shape_label(data, key), "seeds": int(row["seeds"]), "mean loss": row["mean_loss"],
            "± 95 % CI": row["ci95"],
            GAIN_COLUMN: gain_text(data, key, gain),
            "params": row["params"],
            "tokens/s vs baseline": speed / base_speed if speed and base_speed else None}


def summarise(data: StudyData, rules: tuple[Rule, ...] | None = None) -> Summary:
    """The study's answer (``StudyData.answer``, built once) rendered (module docstring)."""
    rules = data.rules() if rules is None else rules
    answer = data.answer(rules)
    rows = []
    if answer.verdict not in (EMPTY, NO_BASELINE):
        if answer.best != data.baseline_key:
            rows.append(_side(data, answer.best, "best", answer.gain))  # type: ignore[arg-type]
        rows.append(_side(data, data.baseline_key, "baseline", None))  # type: ignore[arg-type]
    return Summary(answer, outcome_counts(data), lead_sentence(data, answer), detail_sentences(data, answer),
                   resolved_sentences(answer.rules, rules), rows)
