"""Section 7: per-layer mean attention distance ``D_l`` of the best Prism shapes against the baseline.

``D_l`` (``runners.attention_distance``) is the attention-weighted distance between a query and
the keys it reads, averaged over heads and positions: small is local, large is global. The
Prism paper finds wide-head early layers attend more locally and the schedule's transition
layers line up with the change. Drawn: ``D_l`` per layer (mean over a shape's completed
trainings), ``Delta D_l = D_l(shape) - D_l(baseline)`` on the seeds both share
(``reports.frame.common_seeds``: the baseline's distances on exactly the shape's common seeds,
so that a seed's own pattern does not pass for the schedule's), and dotted lines at each
shape's transition layers (where its head count changes).
"""

from __future__ import annotations

from statistics import fmean

import plotly.graph_objects as go

from nas.arch import ArchConfig
from reports.frame import StudyData, common_seeds, seeds_text, trials_on
from reports.page import BASELINE_COLOUR, SHAPE_COLOURS, Section, plot_text
from reports.summary import shape_label

TOP_SHAPES = 3


def mean_distances(data: StudyData, key: str, seeds: tuple[int, ...] | None = None) -> list[float]:
    """``D_l`` per layer averaged over the shape's completed trainings (on ``seeds``, or all) that measured it."""
    rows = [t.user_attrs.get("attention_distance") for t in trials_on(data, key, seeds)]
    rows = [r for r in rows if r]
    if not rows or len({len(r) for r in rows}) != 1:
        return []
    return [fmean(values) for values in zip(*rows)]


def transitions(heads: tuple[int, ...]) -> list[int]:
    """Layers (1-based) whose head count differs from the previous layer's."""
    return [layer for layer in range(2, len(heads) + 1) if heads[layer - 1] != heads[layer - 2]]


def _prism_shapes(data: StudyData, top: int) -> list[tuple[str, ArchConfig]]:
    out = []
    for row in data.board.itertuples():
        if row.arch and row.key != data.baseline_key:
            arch = ArchConfig.from_dict(row.arch)
            if len(set(arch.heads)) > 1:
                out.append((row.key, arch))
        if len(out) >= top:
            break
    return out


def attention_section(data: StudyData, top: int = TOP_SHAPES) -> Section:
    section = Section("attention", "Attention distance",
                      "Read off where each shape attends locally (small D_l) or globally (large D_l), and how the "
                      "Prism schedules differ from the baseline around their transition layers (dotted).")
    shapes = _prism_shapes(data, top)
    if not shapes:
        section.empty = ("no trained shape has a Prism schedule" + (f": this is a {data.space_name} study"
                                                                     if data.space_name == "hourglass" else " yet"))
        return section
    has_base = data.baseline_key in data.scores
    base = mean_distances(data, data.baseline_key) if has_base else []
    absolute, delta = go.Figure(), go.Figure()
    if base:
        name = f"baseline ({seeds_text(common_seeds(data, data.baseline_key))})"
        absolute.add_trace(go.Scatter(x=list(range(1, len(base) + 1)), y=base, mode="lines+markers",
                                      name=name, line={"dash": "dash", "color": BASELINE_COLOUR}))
    drawn = 0
    for i, (key, arch) in enumerate(shapes):
        d = mean_distances(data, key)
        if not d:
            continue
        drawn += 1
        colour = SHAPE_COLOURS[i % len(SHAPE_COLOURS)]
        name = plot_text(shape_label(data, key))
        layers = list(range(1, len(d) + 1))
        absolute.add_trace(go.Scatter(x=layers, y=d, mode="lines+markers", name=name, line={"color": colour}))
        seeds = common_seeds(data, key) if has_base else ()
        paired, base_paired = mean_distances(data, key, seeds), mean_distances(data, data.baseline_key, seeds)
        if seeds and paired and len(base_paired) == len(paired):
            delta.add_trace(go.Bar(x=layers, y=[a - b for a, b in zip(paired, base_paired)],
                                   name=f"{name} ({seeds_text(seeds)})", marker_color=colour))
        for layer in transitions(arch.heads):
            for fig in (absolute, delta):
                fig.add_vline(x=layer - 0.5, line={"color": colour, "dash": "dot", "width": 1})
    if not drawn:
        section.empty = "the best Prism shapes have no attention distances stored (no completed training measured them)"
        return section
    absolute.update_layout(title="D_l per layer (mean over seeds)", height=400,
                           margin={"t": 40, "l": 60, "r": 20, "b": 50}, showlegend=True)
    absolute.update_xaxes(title_text="layer", dtick=1)
    absolute.update_yaxes(title_text="mean attention distance (tokens)")
    section.figures.append(absolute)
    if delta.data:
        # the legend names each bar's shape, also where one shape is drawn (Plotly hides a lone trace's legend)
        delta.update_layout(title="Delta D_l = D_l(shape) - D_l(baseline), on the seeds both have", height=360,
                            barmode="group", margin={"t": 40, "l": 60, "r": 20, "b": 50}, showlegend=True)
        delta.update_xaxes(title_text="layer", dtick=1)
        delta.update_yaxes(title_text="Delta D_l (tokens)")
        section.figures.append(delta)
    return section
