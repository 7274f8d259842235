"""Section 5: the Hourglass paper's three curves at the matched budget: loss against d_model/L, d_h/d_model and K."""

from __future__ import annotations

import math
from statistics import fmean

import numpy as np
import plotly.graph_objects as go

from reports.frame import StudyData
from reports.leaderboard import ci95
from reports.page import Section, plot_text
from reports.summary import shape_label
from reports.width_depth import MAX_MISSES, PAPER_BAND, QuadraticFit, WidthDepthPoint, fit_width_depth

K_COLOURS = ("#22558c", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")


def _shape_rows(data: StudyData) -> list[dict]:
    """Every shape with completed trainings: its axes (first trial's attrs) and its seeds' losses."""
    by_number = {t.number: t for t in data.trials}
    rows = []
    for key, scores in data.scores.items():
        a = by_number[scores.first_trial].user_attrs
        rows.append({"key": key, "label": shape_label(data, key), "ratio": a.get("d_model_per_layer"),
                     "dh_ratio": a.get("d_h_over_d_model"), "k": a.get("k"), "losses": scores.losses,
                     "params": a.get("params"), "baseline": key == data.baseline_key})
    return [r for r in rows if r["ratio"] is not None]


def _error(losses: tuple[float, ...]) -> float:
    return ci95(losses) or 0.0


def _scatter_by_k(rows: list[dict], x: str) -> list[go.Scatter]:
    """One trace of circles per K, in its colour; the baseline a star of its K's colour, in a legend entry of its own
    (inside its K's trace, the legend drew that K's entry as a star where the baseline came first)."""
    traces = []
    colours = {k: K_COLOURS[i % len(K_COLOURS)] for i, k in enumerate(sorted({r["k"] for r in rows}))}
    for k, colour in colours.items():
        group = [r for r in rows if r["k"] == k and not r["baseline"]]
        if group:
            traces.append(_markers(group, x, f"K={k}", colour, "circle", 8))
    traces += [_markers([r], x, f"baseline (K={r['k']})", colours[r["k"]], "star", 12) for r in rows if r["baseline"]]
    return traces


def _markers(group: list[dict], x: str, name: str, colour: str, symbol: str, size: int) -> go.Scatter:
    """The shapes of ``group`` at their ``x`` and mean loss, with their 95 % intervals, as one legend entry."""
    return go.Scatter(
        x=[r[x] for r in group], y=[fmean(r["losses"]) for r in group], mode="markers", name=name,
        error_y={"type": "data", "array": [_error(r["losses"]) for r in group], "visible": True},
        marker={"size": size, "color": colour, "symbol": symbol},
        text=[plot_text(r["label"]) + (" (baseline)" if r["baseline"] else "") + f", {len(r['losses'])} seeds"
              for r in group],
        hovertemplate="%{text}<br>%{x:.3g}: loss %{y:.4f}<extra></extra>")


def budget_text(rows: list[dict]) -> str:
    """``a budget of 1.35M parameters`` (the shapes' median count), or ``this budget``."""
    params = sorted(r["params"] for r in rows if isinstance(r.get("params"), (int, float)))
    return f"a budget of {params[len(params) // 2] / 1e6:.3g}M parameters" if params else "this budget"


def interval_text(fit: QuadraticFit) -> str:
    """`` (95 % bootstrap interval [a, b])`` where the resamples bound the minimum (``QuadraticFit.bounded``), with
    the share of resamples it is read from where some had no minimum; else why there is none: percentiles of the
    resamples that had one, when half had none, left the fitted minimum outside them (6.56e+03 beside
    [0.0859, 4.36e+03], 51 % of the resamples not U-shaped)."""
    if fit.bounded:
        share = (f" of the {100 * (1 - fit.bootstrap_misses):.0f} % of resamples with a minimum"
                 if fit.bootstrap_misses else "")
        return f" (95 % bootstrap interval [{fit.low:.3g}, {fit.high:.3g}]{share})"
    if fit.bootstrap_misses:
        return f" (no interval: {100 * fit.bootstrap_misses:.0f} % of the resamples have no minimum)"
    return ""


def width_depth_figure(rows: list[dict], notes: list[str]) -> go.Figure:
    points = [WidthDepthPoint(r["label"], float(r["ratio"]), tuple(r["losses"])) for r in rows]
    fig = go.Figure(_scatter_by_k(rows, "ratio"))
    fit = fit_width_depth(points)
    lo, hi = min(p.ratio for p in points), max(p.ratio for p in points)
    if fit is not None:
        grid = np.exp(np.linspace(math.log(lo), math.log(hi), 100))
        fig.add_trace(go.Scatter(x=grid, y=fit.predict(grid), mode="lines", name="quadratic fit in log(d/L)",
                                 line={"color": "#444", "dash": "dot"}))
        if fit.minimum is not None:
            where = "inside" if fit.minimum_inside else "outside (an extrapolation)"
            notes.append(f"Fit: loss = a + b x + c x^2 in x = log(d_model/L), weighted least squares over "
                         f"{fit.n_points} shapes; minimum at d_model/L = {fit.minimum:.3g}{interval_text(fit)}, "
                         f"{where} the trained range [{lo:.3g}, {hi:.3g}].")
            if fit.resolved:
                beyond = (f" (its interval runs beyond the trained range [{lo:.3g}, {hi:.3g}]: the band drawn stops "
                          "at its ends)" if fit.low < lo or fit.high > hi else "")
                notes.append(f"This study's optimum, d_model/L = {fit.minimum:.3g} [{fit.low:.3g}, {fit.high:.3g}]"
                             f"{beyond} at {budget_text(rows)}, beside the Hourglass paper's {PAPER_BAND[0]:.0f}-"
                             f"{PAPER_BAND[1]:.0f} at 113M parameters.")
            else:
                why = ("its fitted minimum lies outside the trained range" if not fit.minimum_inside else
                       f"{100 * fit.bootstrap_misses:.0f} % of the resamples have no minimum"
                       if fit.bootstrap_misses >= MAX_MISSES else "its resamples do not bound it")
                notes.append(f"No optimum of d_model/L is resolved at {budget_text(rows)}: {why}.")
            if fit.minimum_inside:
                fig.add_trace(go.Scatter(x=[fit.minimum], y=fit.predict(np.array([fit.minimum])).tolist(),
                                         mode="markers", name="fitted minimum" + (" (band: 95 % bootstrap)"
                                                                                  if fit.resolved else ""),
                                         marker={"symbol": "x", "size": 12, "color": "#1d2733"}))
                if fit.resolved:
                    fig.add_vrect(x0=max(fit.low, lo), x1=min(fit.high, hi), fillcolor="#22558c", opacity=0.08,
                                  line_width=0)
        else:
            notes.append(f"Fit: the quadratic in log(d_model/L) over {fit.n_points} shapes is not U-shaped "
                         "(c <= 0): no minimum at this budget.")
    else:
        notes.append("Fewer than 3 distinct d_model/L values: no curve is fitted.")
    band = hi >= PAPER_BAND[0] / 1.5 and lo <= PAPER_BAND[1] * 1.5
    if band:
        fig.add_vrect(x0=PAPER_BAND[0], x1=PAPER_BAND[1], fillcolor="#1b9e77", opacity=0.08, line_width=0,
                      annotation_text="paper's optimum 100-250", annotation_position="top right")
    else:
        notes.append(f"The proxy's d_model/L spans {lo:.3g}-{hi:.3g}, far from the paper's optimum band 100-250 "
                     "(GPT-scale models): read the shape of this curve, not its position.")
    span = (min(lo, PAPER_BAND[0]), max(hi, PAPER_BAND[1])) if band else (lo, hi)
    fig.update_xaxes(type="log", title_text="d_model / L (log)",  # a log axis's range is in log10 units
                     range=[math.log10(span[0] / 1.3), math.log10(span[1] * 1.3)])
    fig.update_yaxes(title_text="validation loss (mean over seeds, 95 % CI)")
    fig.update_layout(height=420, title="Loss against width per layer at the matched budget",
                      margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return fig


def _mean_line(rows: list[dict], x: str) -> go.Scatter:
    xs = sorted({r[x] for r in rows})
    means = [fmean(fmean(r["losses"]) for r in rows if r[x] == v) for v in xs]
    return go.Scatter(x=xs, y=means, mode="lines", name="mean over shapes", line={"color": "#444", "dash": "dot"})


def curves_section(data: StudyData) -> Section:
    section = Section("width-depth", "Width, depth, bottleneck and stack depth",
                      "Read off where loss bottoms out: against d_model/L (the Hourglass paper's U-curve), against "
                      "the bottleneck d_h/d_model, and against the FFN stack depth K, every shape at the same budget.")
    rows = _shape_rows(data)
    if not rows:
        section.empty = "no shape has completed a training yet"
        return section
    if len({r["ratio"] for r in rows}) < 2:
        what = "a prism study keeps d_model and L fixed" if data.space_name == "prism" else "every trained shape"
        section.empty = (f"{what}: every shape has d_model/L = {rows[0]['ratio']:.3g} and one FFN shape "
                         f"(K={rows[0]['k']}, d_h/d_model={rows[0]['dh_ratio']:.3g}), so there is no width-depth, "
                         "bottleneck or stack-depth curve to draw")
        return section
    section.figures.append(width_depth_figure(rows, section.notes))
    if len({r["dh_ratio"] for r in rows}) > 1:
        fig = go.Figure(_scatter_by_k(rows, "dh_ratio"))
        fig.update_xaxes(title_text="d_h / d_model")
        fig.update_yaxes(title_text="validation loss")
        fig.update_layout(height=380, title="Loss against the bottleneck ratio (paper: best near 0.4)",
                          margin={"t": 50, "l": 60, "r": 20, "b": 50})
        section.figures.append(fig)
    if len({r["k"] for r in rows}) > 1:
        fig = go.Figure(_scatter_by_k(rows, "k") + [_mean_line(rows, "k")])
        fig.update_xaxes(title_text="K (residual sub-MLPs per layer)", dtick=1)
        fig.update_yaxes(title_text="validation loss")
        fig.update_layout(height=380, title="Loss against the FFN stack depth K (paper: diminishing returns past 6)",
                          margin={"t": 50, "l": 60, "r": 20, "b": 50})
        section.figures.append(fig)
    return section
