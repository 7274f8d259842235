"""Section 3: the best Prism schedules as staircases of head count (and head dim) per layer, beside the baseline."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nas.arch import ArchConfig, format_plateaus
from reports.frame import StudyData
from reports.page import Section, plot_text

MAX_SCHEDULES = 6


def _schedules(data: StudyData, top: int) -> list[tuple[str, ArchConfig, float]]:
    """(rank label, shape, seed-adjusted loss) of the best shapes with a non-uniform head schedule, in ranking order:
    the loss the leaderboard compares (a shape's raw mean over its own two seeds beside the baseline's over
    nineteen read 0.03 nats better where, on common seeds, it was worse)."""
    out = []
    for row in data.board.itertuples():
        arch = ArchConfig.from_dict(row.arch) if row.arch else None
        if arch is not None and len(set(arch.heads)) > 1:
            out.append((f"rank {row.rank}", arch, row.adjusted_loss))
        if len(out) >= top:
            break
    return out


def staircase_section(data: StudyData, top: int = MAX_SCHEDULES) -> Section:
    section = Section("staircases", "Staircases",
                      "Read off which head counts the best schedules use where: bars are heads per layer (labels: "
                      "head dim); the rightmost panel is the uniform baseline; each title's loss is the leaderboard's "
                      "seed-adjusted loss.")
    schedules = _schedules(data, min(top, MAX_SCHEDULES))
    if not schedules:
        section.empty = ("no trained shape has a Prism schedule (a head count that changes with depth): "
                         f"this is a {data.space_name} study" if data.space_name == "hourglass"
                         else "no trained shape has a Prism schedule yet")
        return section
    first = int(schedules[0][0].removeprefix("rank "))
    if first > 1:  # the board's best are uniform: the panels are not "the best schedules" without a word
        above = "rank 1 has" if first == 2 else f"ranks 1-{first - 1} have"
        section.notes.append(f"The leaderboard's {above} a uniform head count (no staircase); the panels are its "
                             f"best non-uniform schedules: "
                             f"{', '.join(label for label, _, _ in schedules)}.")
    baseline_row = data.board[data.board["is_baseline"]]
    panels = list(schedules)
    if not baseline_row.empty and baseline_row.iloc[0]["arch"]:
        row = baseline_row.iloc[0]
        panels.append(("baseline", ArchConfig.from_dict(row["arch"]), row["adjusted_loss"]))
    whole = len({(a.ffn, a.d_model, a.n_layers, a.kv_heads) for _, a, _ in panels}) > 1  # not the heads alone
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.02,
                        subplot_titles=[f"{label}: {plot_text(a.label() if whole else format_plateaus(a.heads))}"
                                        f"<br>seed-adj. loss {loss:.4f}" for label, a, loss in panels])
    top_heads = max(max(a.heads) for _, a, _ in panels)
    for col, (label, arch, _) in enumerate(panels, start=1):
        layers = list(range(1, arch.n_layers + 1))
        fig.add_trace(go.Bar(x=layers, y=list(arch.heads), text=[str(d) for d in arch.head_dims()],
                             textposition="outside", name=label, showlegend=False,
                             marker_color="#8a99a8" if label == "baseline" else "#22558c",
                             hovertemplate="layer %{x}: %{y} heads, head dim %{text}<extra></extra>"),
                      row=1, col=col)
        fig.update_xaxes(title_text="layer", dtick=max(1, arch.n_layers // 6), row=1, col=col)
    fig.update_yaxes(title_text="heads", range=[0, top_heads * 1.25], row=1, col=1)
    fig.update_layout(height=360, margin={"t": 70, "l": 50, "r": 10, "b": 40}, bargap=0.15)
    fig.update_annotations(font_size=11)
    section.figures.append(fig)
    return section
