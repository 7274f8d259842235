"""``nas report``: one self-contained HTML page that answers "which shape, and how sure are we?".

Sections, in order: the summary (counts, best shape against the baseline, one plain sentence),
the leaderboard (the numbers of ``nas best``, with each shape's paired gain), the design rules read across
every run (``reports.rules``), for a grouped-query
study loss against KV cache (``reports.kv_cache``), the staircases,
the width-depth / bottleneck / stack-depth curves, the search dynamics, the training curves
with milestones, the attention distances, and the full-scale re-runs. A section with nothing
to draw says so in one line.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import nas
from nas.files import OutputFile
from reports.attention import attention_section
from reports.curves import curves_section
from reports.dynamics import dynamics_section
from reports.frame import StudyData
from reports.kv_cache import has_grouped, kv_cache_section
from reports.leaderboard import expected_gain_text
from reports.page import Section, render_page, table, text
from reports.reruns import reruns_section
from reports.rules import rules_section
from reports.staircases import staircase_section
from reports.summary import Summary, board_gain_columns, gain_text, kv_sentence, shape_label, summarise
from reports.training import training_section

PLOTLYJS_MODES = ("inline", "cdn")
# how the leaderboard and summary tables show their numbers
SHAPE_FORMATS = {"seed-adj. loss": "{:.4f}", "mean loss": "{:.4f}", "± ci95": "{:.4f}", "± 95 % CI": "{:.4f}",
                 "gain % (adj.)": "{:+.2f}",
                 "params": "{:,}", "tokens/s": "{:,.0f}", "tokens/s vs baseline": "{:.2f}x"}


def summary_section(data: StudyData, summary: Summary) -> Section:
    counts = ", ".join(f"{n} {what}" for what, n in summary.counts.items() if n or what in ("complete", "pruned"))
    facts = [{"study": data.name, "space": data.space_name, "preset": data.preset, "data": data.data,
              "objectives": ", ".join(data.objectives), "trials": len(data.trials), "outcomes": counts}]
    html = f'<p class="verdict">{text(summary.sentence)}</p>'
    if summary.detail:
        html += f'<p class="note">{text(summary.detail)}</p>'
    if summary.rule_sentences:
        html += ('<p class="note">Design rules (the section below has them all):</p><ul class="rules">'
                 + "".join(f"<li>{text(s[0].upper() + s[1:])}.</li>" for s in summary.rule_sentences) + "</ul>")
    html += table(facts) + table(summary.rows, css="board", formats=SHAPE_FORMATS)
    timed = [row for row in summary.rows if row.get("tokens/s vs baseline") is not None]
    if any(row[""] != "baseline" for row in timed):  # the baseline alone (it is the answer): 1x says nothing
        html += f'<p class="note">{text(speed_note(timed))}</p>'
    if data.skipped:
        html += ('<p class="note">Left out of every figure and number, their stored attributes being unreadable: '
                 + "; ".join(text(line) for line in data.skipped) + ".</p>")
    return Section("summary", "Summary", "Read off the answer: the best shape against the uniform baseline (after "
                   "adaptive replicates its shrunk gain with a credible interval; after a race or fixed replicates "
                   "its paired gain on common seeds, leaving out the seed that selected it), and what is tied with it.",
                   html=html)


def speed_note(rows: list[dict]) -> str:
    """What the summary's tokens/s ratio is: a ratio of medians over each side's own runs, timed where and when each
    ran, beside whatever shared the machine (7.7x was read between two shapes of one size on a loaded machine)."""
    runs = " and ".join(f"{row['seeds']} run{'s' if row['seeds'] != 1 else ''}" for row in rows
                        if row[""] != "baseline")
    base = next((row["seeds"] for row in rows if row[""] == "baseline"), 0)
    return (f"tokens/s vs baseline: the median tokens/s of the shape's {runs} over the baseline's {base}, each run "
            "timed beside whatever else shared its machine then: far from 1x between shapes of one size, it "
            "measures load, not shape (`nas bench --only 1` times schedules side by side).")


def leaderboard_section(data: StudyData, summary: Summary, top: int) -> Section:
    section = Section("leaderboard", "Leaderboard",
                      "Read off the ranking (the numbers of `nas best`) by expected gain: the shape's paired gain "
                      "over the baseline shrunk by what its number of seeds supports (an empirical-Bayes posterior "
                      "mean with its 95 % interval), so that one lucky seed does not top the board; then the "
                      "unshrunk seed-adjusted loss, the plain mean over seeds, the paired gain on common seeds "
                      "without the selecting seed, and which shapes are tied with the best.")
    if data.board.empty:
        section.empty = "no shape has completed a training yet"
        return section
    tied = set(summary.tied)
    shown = data.shown(top)
    rows = []
    first, second = board_gain_columns(data)
    adaptive = data.evidence.adaptive
    for r in shown.itertuples():
        gain = data.evidence.honest_gain(r.key) if r.key != data.baseline_key else None
        credible, paired = expected_gain_text(r), gain_text(data, r.key, gain)
        # the answer's shape where the board ranks it lower (after a race); the baseline is marked as such already
        pick = r.key == summary.best and r.rank != 1 and not r.is_baseline
        rows.append({"rank": r.rank, "shape": shape_label(data, r.key) + (" (the answer's pick)" if pick else ""),
                     "seeds": r.seeds,
                     first: credible if adaptive else paired, second: paired if adaptive else credible,
                     "loss on the baseline's seeds": r.loss_on_baseline_seeds, "seed-adj. loss": r.adjusted_loss,
                     "tied with best": r.key in tied, "params": r.params, "tokens/s": r.tokens_per_s,
                     "baseline": r.is_baseline, "trials": r.trials})
    section.html = table(rows, css="board", formats=SHAPE_FORMATS)
    if len(data.board) > len(shown):
        hidden = len(data.board) - len(shown)
        section.notes.append(f"{hidden} more shape{'s are' if hidden > 1 else ' is'} not shown (--top {top}).")
    return section


def build_report(data: StudyData, top: int = 10, plotlyjs: str = "inline") -> str:
    """The whole page for the snapshot ``data``."""
    summary = summarise(data)
    sections = [summary_section(data, summary), leaderboard_section(data, summary, top), rules_section(data),
                *([kv_cache_section(data, summary.answer, kv_sentence(data, summary.answer.cheapest)
                                    if summary.answer.cheapest else "")] if has_grouped(data) else []),
                staircase_section(data),
                curves_section(data), dynamics_section(data), training_section(data), attention_section(data),
                reruns_section(data)]
    made = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = f"{data.space_name} space, preset {data.preset}, data {data.data}: {summary.sentence}"
    return render_page(f"prism-nas report: {data.name}", subtitle, sections, plotlyjs,
                       f"prism-nas {nas.__version__}, made {made} from {len(data.trials)} trials.")


def write_report(data: StudyData, path: str | Path | OutputFile, top: int = 10,
                 plotlyjs: str = "inline") -> tuple[Path, float]:
    """Write the page to ``path`` (``nas.files.OutputFile``: checked first, then a temporary file and an atomic
    rename, so a reader never sees half a page and a failed write leaves nothing); (path, seconds)."""
    started = time.perf_counter()
    target = path if isinstance(path, OutputFile) else OutputFile.of(path, "report file")
    page = build_report(data, top, plotlyjs)
    target.write(page)
    assert target.path is not None
    return target.path, time.perf_counter() - started
