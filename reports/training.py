"""Section 6: training curves of the best shapes and the baseline, and when each reaches the baseline's final loss.

The Prism paper reports that its schedules reach loss milestones earlier. Here the milestone is
the baseline's final validation loss ``L_b`` (mean over its seeds): for each shape, the first
token count at which its mean validation curve is at or below ``L_b``, linearly interpolated
between evaluation points, and that count as a share of the baseline's training tokens.
Curves are means over each shape's completed trainings (they share their evaluation points).
"""

from __future__ import annotations

from statistics import fmean

import plotly.graph_objects as go
from optuna.trial import TrialState

from reports.frame import StudyData
from reports.page import Section, plot_text, table
from reports.summary import shape_label

TOP_SHAPES = 5


def mean_curve(data: StudyData, key: str, which: str = "eval_curve") -> list[tuple[int, float]]:
    """A shape's curve averaged over its completed trainings, at the token counts they all share."""
    curves = [t.user_attrs.get(which) or [] for t in data.trials
              if t.number in set(data.scores[key].trials) and t.state == TrialState.COMPLETE]
    curves = [{int(tokens): loss for tokens, loss in c if loss is not None} for c in curves if c]
    if not curves:
        return []
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return [(tokens, fmean(c[tokens] for c in curves)) for tokens in shared]


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first token count at which ``curve`` is at or below ``target`` (interpolated), or None."""
    previous = None
    for tokens, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(tokens)
            (t0, l0) = previous
            return t0 + (l0 - target) / (l0 - loss) * (tokens - t0)
        previous = (tokens, loss)
    return None


def _shown_keys(data: StudyData, top: int) -> list[str]:
    keys = [k for k in data.board["key"] if k != data.baseline_key][:top]
    return keys + ([data.baseline_key] if data.baseline_key in data.scores else [])


def training_section(data: StudyData, top: int = TOP_SHAPES) -> Section:
    section = Section("training", "Training curves",
                      "Read off which shapes learn faster: validation loss against training tokens (mean over seeds), "
                      "and the token count at which each first reaches the baseline's final loss.")
    if data.board.empty:
        section.empty = "no shape has completed a training yet"
        return section
    keys = _shown_keys(data, top)
    evals = go.Figure()
    trains = go.Figure()
    for key in keys:
        name = plot_text(shape_label(data, key)) + (" (baseline)" if key == data.baseline_key else "")
        style = {"dash": "dash", "color": "#d95f02"} if key == data.baseline_key else {}
        curve = mean_curve(data, key)
        if curve:
            evals.add_trace(go.Scatter(x=[t for t, _ in curve], y=[v for _, v in curve], mode="lines+markers",
                                       name=name, line=style))
        train_curve = mean_curve(data, key, "train_curve")
        if train_curve:
            trains.add_trace(go.Scatter(x=[t for t, _ in train_curve], y=[v for _, v in train_curve], mode="lines",
                                        name=name, line=style))
    for fig, what in ((evals, "validation loss"), (trains, "training loss (sparse points)")):
        fig.update_xaxes(title_text="training tokens")
        fig.update_yaxes(title_text=what)
        fig.update_layout(height=400, margin={"t": 40, "l": 60, "r": 20, "b": 50}, legend={"font": {"size": 11}})
    evals.update_layout(title="Validation loss during training")
    trains.update_layout(title="Training loss")
    section.figures.extend([evals, trains])
    if data.baseline_key in data.scores:
        target = data.scores[data.baseline_key].mean
        base_curve = mean_curve(data, data.baseline_key)
        base_tokens = base_curve[-1][0] if base_curve else None
        rows = []
        for key in keys:
            reached = tokens_to_reach(mean_curve(data, key), target)
            rows.append({"shape": shape_label(data, key) + (" (baseline)" if key == data.baseline_key else ""),
                         "final mean loss": data.scores[key].mean,
                         "tokens to reach the baseline's final loss": round(reached) if reached else None,
                         "share of the baseline's tokens": reached / base_tokens if reached and base_tokens else None})
        formats = {"final mean loss": "{:.4f}", "share of the baseline's tokens": "{:.2f}x",
                   "tokens to reach the baseline's final loss": "{:,}"}
        section.html = table(rows, formats=formats) + (
            f'<p class="note">Milestone: the baseline\'s final mean loss, {target:.4f}. '
            "A dash: not reached within the training budget.</p>")
    return section
