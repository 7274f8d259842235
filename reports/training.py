"""Section 6: training curves of the best shapes against the baseline on common seeds, and milestones.

The Prism paper reports that its schedules reach loss milestones earlier. Curves are compared on
**common seeds** (``reports.frame.common_seeds``): a shape's curve is the mean over its completed
trainings on the seeds the baseline also has, and its reference is the baseline's mean curve on
those same seeds. A shape trained on seed 0 alone is thus compared with the baseline's seed 0, not
with the baseline's mean over nine seeds, whose other seeds were about 0.1 nats unluckier on the
default proxy (a one-seed shape would otherwise seem to learn twice as fast). The milestone is the
baseline's final validation loss on those seeds, ``L_b(S)``: for each shape, the first token count
at which its curve on ``S`` is at or below ``L_b(S)``, linearly interpolated between evaluation
points, as a share of the baseline's training tokens.
"""

from __future__ import annotations

from statistics import fmean

import plotly.graph_objects as go

from reports.frame import StudyData, common_seeds, seeds_text, trials_on
from reports.page import BASELINE_COLOUR, SHAPE_COLOURS, Section, plot_text, table
from reports.summary import shape_label

TOP_SHAPES = 5


def mean_curve(data: StudyData, key: str, which: str = "eval_curve",
               seeds: tuple[int, ...] | None = None) -> list[tuple[int, float]]:
    """A shape's curve averaged over its completed trainings (on ``seeds``, or all), at the token counts they share."""
    curves = [t.user_attrs.get(which) or [] for t in trials_on(data, key, seeds)]
    curves = [{int(tokens): loss for tokens, loss in c if loss is not None} for c in curves if c]
    if not curves:
        return []
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    return [(tokens, fmean(c[tokens] for c in curves)) for tokens in shared]


def final_mean(data: StudyData, key: str, seeds: tuple[int, ...]) -> float | None:
    """The shape's mean final validation loss over its trainings on ``seeds``."""
    scores = data.scores[key]
    losses = [loss for seed, loss in zip(scores.seeds, scores.losses) if seed in seeds]
    return fmean(losses) if losses else None

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
                      "Read off which shapes learn faster: validation loss against training tokens, each shape on the "
                      "seeds it shares with the baseline and the baseline on those same seeds (dashed), and the "
                      "token count at which each first reaches the baseline's final loss on them.")
    if data.board.empty:
        section.empty = "no shape has completed a training yet"
        return section
    keys = _shown_keys(data, top)
    evals, trains = go.Figure(), go.Figure()
    has_base = data.baseline_key in data.scores
    # a shape with no seed in common with the baseline is drawn on its own seeds, with no milestone
    seed_sets = {key: (common_seeds(data, key) if has_base else ()) or tuple(sorted(set(data.scores[key].seeds)))
                 for key in keys}
    references = list(dict.fromkeys(seeds for key, seeds in seed_sets.items() if seeds)) if has_base else []
    for i, key in enumerate(key for key in keys if key != data.baseline_key):
        name = f"{plot_text(shape_label(data, key))} ({seeds_text(seed_sets[key])})"
        _add_curves(evals, trains, data, key, seed_sets[key], name, {"color": SHAPE_COLOURS[i % len(SHAPE_COLOURS)]})
    for seeds in references:  # the baseline once per seed set a shown shape is compared on
        _add_curves(evals, trains, data, data.baseline_key, seeds, f"baseline ({seeds_text(seeds)})",
                    {"dash": "dash", "color": BASELINE_COLOUR})
    for fig, what in ((evals, "validation loss"), (trains, "training loss (sparse points)")):
        fig.update_xaxes(title_text="training tokens")
        fig.update_yaxes(title_text=what)
        fig.update_layout(height=400, margin={"t": 40, "l": 60, "r": 20, "b": 50}, legend={"font": {"size": 11}})
    # "on common seeds" only where a shown shape shares a seed with the baseline
    others = [key for key in keys if key != data.baseline_key]
    shared = has_base and any(common_seeds(data, key) for key in others)
    seeds_said = ("on common seeds" if shared else "the baseline alone: no other shape has a completed training"
                  if not others else "on each shape's own seeds: " + (
                      "none shares a seed with the baseline" if has_base else "the baseline has no completed training"))
    evals.update_layout(title=f"Validation loss during training ({seeds_said})")
    trains.update_layout(title=f"Training loss ({seeds_said})")
    section.figures.extend([evals, trains])
    if has_base:
        section.html = _milestones(data, keys, seed_sets)
    return section


def _add_curves(evals: go.Figure, trains: go.Figure, data: StudyData, key: str, seeds: tuple[int, ...], name: str,
                style: dict) -> None:
    curve = mean_curve(data, key, seeds=seeds)
    if curve:
        evals.add_trace(go.Scatter(x=[t for t, _ in curve], y=[v for _, v in curve], mode="lines+markers",
                                   name=name, line=style))
    train_curve = mean_curve(data, key, "train_curve", seeds)
    if train_curve:
        trains.add_trace(go.Scatter(x=[t for t, _ in train_curve], y=[v for _, v in train_curve], mode="lines",
                                    name=name, line=style))


def _milestones(data: StudyData, keys: list[str], seed_sets: dict[str, tuple[int, ...]]) -> str:
    """The table: each shape against the baseline's final loss on the seeds they share."""
    base_curve = mean_curve(data, data.baseline_key)
    base_tokens = base_curve[-1][0] if base_curve else None
    rows = []
    for key in keys:
        seeds = seed_sets[key]
        target = final_mean(data, data.baseline_key, seeds) if seeds else None
        reached = tokens_to_reach(mean_curve(data, key, seeds=seeds), target) if target is not None else None
        rows.append({"shape": shape_label(data, key) + (" (baseline)" if key == data.baseline_key else ""),
                     "seeds": seeds_text(seeds), "final mean loss": final_mean(data, key, seeds) if seeds else None,
                     "baseline's final loss on these seeds": target,
                     "tokens to reach it": round(reached) if reached else None,
                     "share of the baseline's tokens": reached / base_tokens if reached and base_tokens else None})
    formats = {"final mean loss": "{:.4f}", "baseline's final loss on these seeds": "{:.4f}",
               "share of the baseline's tokens": "{:.2f}x", "tokens to reach it": "{:,}"}
    return table(rows, formats=formats) + (
        '<p class="note">Milestone: the baseline\'s final mean loss on the seeds the shape shares with it (a shape '
        "with no such seed has none). A dash: not reached within the training budget.</p>")
