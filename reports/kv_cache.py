"""Loss against KV cache: the trade-off a grouped-query search answers, and the cheapest shape tied with the best.

A shape's KV cache is what inference keeps per token of context, ``2 sum_l kv_l d_head_l`` values
(``nas.arch.ArchConfig.kv_cache_bytes_per_token``, 16-bit values); grouped-query attention divides a
layer's share by its group size. Each shape of the board is drawn at its KV cache and its ranked loss
(what ``nas best`` ranks by: the baseline's mean plus the shrunk paired difference), the Pareto front
of the two joined, the baseline marked. The answer a user wants is the *free lunch*: among the shapes
the study cannot tell from the best (the answer's tied set), the one with the smallest cache
(``nas.stats.answer.Answer.cheapest``), stated with its share of the baseline's cache
(``reports.summary.kv_sentence``).

Shown for studies that trained a shape with grouped key/value heads; old studies (no ``kv_heads`` in
their shapes) read as multi-head attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from nas.arch import ArchConfig
from nas.stats.answer import Answer
from reports.frame import StudyData
from reports.page import BASELINE_COLOUR, Section, plot_text, table


@dataclass(frozen=True)
class KVPoint:
    """One shape of the board on the loss-KV cache plane."""

    key: str
    label: str
    loss: float  # the board's ranked loss
    kv_bytes: int  # KV-cache bytes per token of context
    rank: int
    seeds: int
    is_baseline: bool
    grouped: bool


def _arch(value: Any) -> ArchConfig | None:
    return ArchConfig.from_dict(value) if isinstance(value, dict) else None


def kv_points(data: StudyData) -> list[KVPoint]:
    """The board's shapes in rank order, each at its KV cache and ranked loss."""
    if data.board.empty:
        return []
    points = []
    for row in data.board.itertuples():
        arch = _arch(row.arch)
        if arch is None or row.ranked_loss != row.ranked_loss:
            continue
        points.append(KVPoint(row.key, arch.label(), float(row.ranked_loss), arch.kv_cache_bytes_per_token(),
                              int(row.rank), int(row.seeds), bool(row.is_baseline), arch.grouped))
    return points


def has_grouped(data: StudyData) -> bool:
    """Whether the study trained a shape with grouped key/value heads."""
    return any(p.grouped for p in kv_points(data))


def pareto_front(points: list[KVPoint]) -> list[KVPoint]:
    """The shapes no other beats on both loss and KV cache, by ascending cache."""
    front: list[KVPoint] = []
    for point in sorted(points, key=lambda p: (p.kv_bytes, p.loss)):
        if not front or point.loss < front[-1].loss:
            front.append(point)
    return front


def kv_cache_figure(data: StudyData, answer: Answer) -> go.Figure:
    points = kv_points(data)
    front = pareto_front(points)
    tied_keys = set(answer.tied)
    cheapest = next((p for p in points if p.key == answer.cheapest), None)
    fig = go.Figure()
    groups = (("other shapes", lambda p: not p.is_baseline and p.key not in tied_keys, "#8a9bb0", "circle", 7),
              ("tied with the best", lambda p: not p.is_baseline and p.key in tied_keys, "#22558c", "circle", 9),
              ("baseline", lambda p: p.is_baseline, BASELINE_COLOUR, "star", 15))
    for name, keep, colour, symbol, size in groups:
        chosen = [p for p in points if keep(p)]
        if not chosen:
            continue
        fig.add_trace(go.Scatter(
            x=[p.kv_bytes for p in chosen], y=[p.loss for p in chosen], mode="markers", name=name,
            marker={"color": colour, "symbol": symbol, "size": size},
            text=[plot_text(f"#{p.rank} {p.label} ({p.seeds} seed{'s' * (p.seeds != 1)})") for p in chosen],
            hovertemplate="%{text}<br>KV cache %{x:,} bytes/token<br>ranked loss %{y:.4f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[p.kv_bytes for p in front], y=[p.loss for p in front], mode="lines",
                             line_shape="hv", name="Pareto front", line={"color": "#1d2733", "width": 1.5}))
    if cheapest is not None:
        fig.add_annotation(x=cheapest.kv_bytes, y=cheapest.loss, text="cheapest tied with the best",
                           showarrow=True, arrowhead=2, ax=40, ay=-40)
    fig.update_xaxes(title_text="KV cache, bytes per token of context (16-bit values)", rangemode="tozero")
    fig.update_yaxes(title_text="ranked validation loss (as nas best ranks)")
    fig.update_layout(height=440, title="Loss against KV cache", margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return fig


def kv_cache_section(data: StudyData, answer: Answer, cheapest_sentence: str = "") -> Section:
    section = Section("kv-cache", "Loss against KV cache",
                      "Read off what grouped key/value heads cost and save: each shape at its KV cache per token "
                      "and its ranked loss, the Pareto front of the two, the baseline marked; the cheapest shape "
                      "the study cannot tell from the best is the one to take.")
    points = kv_points(data)
    if not points:
        section.empty = "no shape has completed a training yet"
        return section
    section.figures.append(kv_cache_figure(data, answer))
    base = next((p for p in points if p.is_baseline), None)
    rows = [{"shape": p.label, "rank": p.rank, "seeds": p.seeds, "ranked loss": p.loss,
             "KV cache bytes/token": p.kv_bytes,
             "vs baseline's cache": p.kv_bytes / base.kv_bytes if base else None,
             "tied with best": p.key in set(answer.tied)} for p in pareto_front(points)]
    section.html = ('<p class="note">The Pareto front:</p>'
                    + table(rows, css="board", formats={"ranked loss": "{:.4f}", "KV cache bytes/token": "{:,}",
                                                        "vs baseline's cache": "{:.2f}x"}))
    if cheapest_sentence:
        section.notes.append(cheapest_sentence)
    return section
