"""The study's note in optuna-dashboard: the summary sentence and the leaderboard, refreshed as trials finish.

optuna-dashboard's own "best" is the single luckiest trial (one seed); the note says what the
report says: the best shape by the leaderboard's ranking (seed-adjusted loss), its honest paired
gain over the baseline, and the tied set. ``NoteRefresher`` writes it from the search's workers at most every
``interval_s`` seconds and once more when a worker ends, so it costs the search almost nothing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from reports.frame import StudyData, read_study
from reports.leaderboard import expected_gain_text
from reports.summary import board_gain_columns, gain_text, shape_label, summarise

NOTE_ROWS = 10


def note_text(data: StudyData, top: int = NOTE_ROWS) -> str:
    """The note, in Markdown."""
    summary = summarise(data)
    lines = [f"## {data.name}", "", f"**{summary.sentence}**", "", summary.detail, ""]
    if summary.rule_sentences:
        lines += ["Design rules:", "", *(f"- {s[0].upper() + s[1:]}." for s in summary.rule_sentences), ""]
    lines += ["Ranked by expected gain (the paired gain over the baseline on shared seeds, shrunk by what the "
              "shape's number of seeds supports: one lucky seed does not top the board); "
              "the dashboard's own *best trial* is one seed, not a shape. "
              f"`nas report --study-name {shlex.quote(data.name)}` draws the whole picture.", ""]
    if data.board.empty:
        return "\n".join(lines)
    first, second = board_gain_columns(data)
    adaptive = data.evidence.adaptive
    lines += [f"| rank | shape | seeds | {first} | {second} | loss on the baseline's seeds | adj. loss | tied |",
              "|---|---|---|---|---|---|---|---|"]
    shown = data.shown(top)
    for r in shown.itertuples():
        gain = data.evidence.honest_gain(r.key) if r.key != data.baseline_key else None
        credible, paired = expected_gain_text(r), gain_text(data, r.key, gain)
        on_base = f"{r.loss_on_baseline_seeds:.4f}" if r.loss_on_baseline_seeds == r.loss_on_baseline_seeds \
            and r.loss_on_baseline_seeds is not None else "-"
        label = shape_label(data, r.key).replace("|", "/") + (" (baseline)" if r.is_baseline else "")
        lines.append(f"| {r.rank} | {label} | {r.seeds} | {credible if adaptive else paired} | "
                     f"{paired if adaptive else credible} | {on_base} | {r.adjusted_loss:.4f} | "
                     f"{'yes' if r.key in summary.tied else ''} |")
    return "\n".join(lines)


def _save_note_alone() -> Callable[[optuna.Study, str], None] | None:
    """``save_note`` from ``optuna_dashboard/_note.py`` executed on its own (not as part of the package), or None
    where the installed optuna-dashboard has no such file."""
    package = importlib.util.find_spec("optuna_dashboard")
    locations = package.submodule_search_locations if package is not None else None
    path = Path(locations[0]) / "_note.py" if locations else None
    if path is None or not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_nas_optuna_dashboard_note", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.save_note


@functools.cache
def dashboard_save_note() -> Callable[[optuna.Study, str], None]:
    """optuna-dashboard's ``save_note``, loaded from its own module ``optuna_dashboard/_note.py`` alone (which imports
    only optuna) when the package is not imported yet: ``import optuna_dashboard`` runs its server's imports too,
    ``optuna.importance`` and scikit-learn, ~1 s of CPU on a 2-core Xeon and ~2 s on an AMD EPYC, in every search
    process that writes the note. Where that module is not found or does not load alone (another optuna-dashboard
    layout), the package's ``save_note`` as usual."""
    alone = None
    if "optuna_dashboard" not in sys.modules:
        with contextlib.suppress(Exception):  # any failure to load it alone: the package's own, below
            alone = _save_note_alone()
    if alone is not None:
        return alone
    import optuna_dashboard

    return optuna_dashboard.save_note


def refresh_note(study: optuna.Study) -> None:
    dashboard_save_note()(study, note_text(read_study(study)))


class NoteRefresher:
    """Refresh the study note at most every ``interval_s`` seconds (``force`` writes it now)."""

    def __init__(self, interval_s: float = 30.0) -> None:
        self.interval_s, self._last = interval_s, -float("inf")

    def __call__(self, study: optuna.Study, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self.interval_s:
            self._last = now
            refresh_note(study)
