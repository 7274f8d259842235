"""Plots of recorded benchmark figures for the docs (``python docs/make_images.py`` renders them to PNG).

- figure 10 (``benchmarks/data/ranking_simulation.json``): P(pick = true best) of each replicate policy
  against its replicate trials, at the measured and at half the paired noise;
- figure 12 (``benchmarks/data/proxy_fidelity.json``): each (proxy, score)'s separation and Kendall tau
  against the reference panel, against the CPU seconds one trial costs;
- figure 13 (``benchmarks/data/rule_simulation.json``): the design rules on known truths, per study size: each
  rule's interval coverage, the null rule's false rule rate, the planted rule's power.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

DATA = Path(__file__).parent / "data"
POLICY_COLOURS = {"fixed": "#1b9e77", "race": "#d95f02", "adaptive-pick": "#e6ab02", "adaptive": "#e7298a",
                  "adaptive-answer": "#66a61e", "oracle": "#7570b3"}
SCORE_SYMBOLS = {"final": "circle", "train_mean": "square", "train_last_half": "diamond", "val_auc": "star",
                 "extrapolated": "x"}


def figure_10(data: dict[str, Any] | None = None) -> go.Figure:
    data = data or json.loads((DATA / "ranking_simulation.json").read_text())
    fig = go.Figure()
    for policy, colour in POLICY_COLOURS.items():
        for noise, dash in (("measured", "solid"), ("paired sd x0.5", "dot")):
            rows = sorted((r for r in data["rows"] if r["policy"] == policy and r["noise"] == noise),
                          key=lambda r: r["replicate trials"])
            if rows:
                fig.add_trace(go.Scatter(x=[r["replicate trials"] for r in rows],
                                         y=[r["P(pick = true best)"] for r in rows], mode="lines+markers",
                                         name=f"{policy}, {'measured noise' if noise == 'measured' else 'half noise'}",
                                         line={"color": colour, "dash": dash}))
    fig.update_xaxes(title_text="replicate trials after the 129-member walk")
    fig.update_yaxes(title_text="P(pick = true best)", range=[0, 1])
    studies = sorted({r["studies"] for r in data["rows"]})
    per_point = f"{studies[0]:,}" if len(studies) == 1 else f"{studies[0]:,}-{studies[-1]:,}"
    fig.update_layout(title=f"Figure 10: picking the true best on known truths ({per_point} simulated studies a point)",
                      height=460, width=860, margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return fig


def figure_11(data: dict[str, Any] | None = None) -> go.Figure:
    """Figure 11(c)'s question on figure 12's stored runs: how well the loss after ``t`` tokens ranks the runs by
    their final score (Spearman), per proxy configuration; where a median pruner could start."""
    data = data or json.loads((DATA / "proxy_fidelity.json").read_text())
    fig = go.Figure()
    colours = ["#22558c", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"]
    for i, config in enumerate(data["configs"]):
        curve = config.get("result", {}).get("pruning_spearman", {})
        if curve:
            tokens = sorted(curve, key=int)
            fig.add_trace(go.Scatter(x=[int(t) / 1024 for t in tokens], y=[curve[t] for t in tokens],
                                     mode="lines+markers", name=config["name"],
                                     line={"color": colours[i % len(colours)]}))
    fig.add_hline(y=0.9, line_dash="dash", line_color="#999", annotation_text="ranks like the final (0.9)")
    fig.update_xaxes(title_text="tokens seen (k)")
    fig.update_yaxes(title_text="Spearman: loss at t vs final score", range=[-0.4, 1.0])
    fig.update_layout(title="Figure 11(c): how early a run's loss ranks the runs (figure 12's runs, per proxy)",
                      height=460, width=860, margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return fig


def figure_12(data: dict[str, Any] | None = None) -> go.Figure:
    data = data or json.loads((DATA / "proxy_fidelity.json").read_text())
    fig = make_subplots(rows=1, cols=2, subplot_titles=("separation (spread of true means / paired sd)",
                                                        "Kendall tau of shape means vs the reference panel"))
    colours = ["#22558c", "#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"]
    for i, config in enumerate(data["configs"]):
        result = config.get("result", {})
        for score, f in result.get("scores", {}).items():
            x = result["cpu_s_per_trial"]
            common = {"mode": "markers", "legendgroup": config["name"], "showlegend": False,
                      "marker": {"color": colours[i % len(colours)], "symbol": SCORE_SYMBOLS.get(score, "circle"),
                                 "size": 11}, "hovertext": f"{config['name']}: {score}"}
            fig.add_trace(go.Scatter(x=[x], y=[f["separation"]], name=config["name"], **common), row=1, col=1)
            if f.get("tau") is not None:
                fig.add_trace(go.Scatter(x=[x], y=[f["tau"]], name=config["name"],
                                         error_y={"type": "data", "symmetric": False,
                                                  "array": [f["tau_high"] - f["tau"]],
                                                  "arrayminus": [f["tau"] - f["tau_low"]]}, **common), row=1, col=2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=config["name"],
                                 marker={"color": colours[i % len(colours)], "size": 11}), row=1, col=1)
    for score, symbol in SCORE_SYMBOLS.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"score: {score}",
                                 marker={"color": "#555", "symbol": symbol, "size": 11}), row=1, col=1)
    fig.add_hline(y=1.5, line_dash="dash", line_color="#999", annotation_text="target 1.5", row=1, col=1)
    fig.add_hline(y=0.6, line_dash="dash", line_color="#999", annotation_text="target 0.6", row=1, col=2)
    fig.update_xaxes(title_text="CPU seconds per trial (one core)")
    fig.update_layout(title="Figure 12: proxies and scores at their CPU cost (the reference panel's 13 shapes)",
                      height=520, width=1200, margin={"t": 70, "l": 60, "r": 20, "b": 50})
    return fig


def figure_13(data: dict[str, Any] | None = None) -> go.Figure:
    """Per row of the rule simulation (trials, the shapes' sd beyond the rules): coverage of the null and the
    planted rule's 95 % interval (target 0.95), the false rule rate (target 0.05) and the power against the planted
    rule, with the binomial 95 % band of each share over the row's studies."""
    data = data or json.loads((DATA / "rule_simulation.json").read_text())
    rows = sorted(data["rows"], key=lambda r: (r["tau"], r["trials"]))
    labels = [f"{r['trials']} trials, tau {r['tau']:g}" for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("95 % interval coverage (target >= 0.95)",
                                                        "false rule rate (target <= 0.05) and power"))

    def series(prefix: str) -> list[float | None]:
        return [next((v for k, v in r.items() if k.startswith(prefix)), None) for r in rows]

    def band(values: list[float | None]) -> list[float]:
        return [0.0 if v is None else 1.96 * (v * (1 - v) / r["studies"]) ** 0.5 for v, r in zip(values, rows)]

    for col, items in ((1, (("coverage reduced_layers", "null rule", "#1b9e77"),
                            ("coverage log2_first_heads", "planted rule", "#d95f02"))),
                       (2, (("false rule rate", "false rule rate (null rule resolved)", "#7570b3"),
                            ("power log2_first_heads", "power (planted rule resolved, right sign)", "#e7298a")))):
        for prefix, name, colour in items:
            values = series(prefix)
            fig.add_trace(go.Scatter(x=labels, y=values, mode="markers", name=name, marker={"color": colour,
                                     "size": 11}, error_y={"type": "data", "array": band(values)}), row=1, col=col)
    fig.add_hline(y=0.95, line_dash="dash", line_color="#999", annotation_text="0.95", row=1, col=1)
    fig.add_hline(y=0.05, line_dash="dash", line_color="#999", annotation_text="0.05", row=1, col=2)
    fig.update_yaxes(range=[0.85, 1.0], row=1, col=1)
    fig.update_yaxes(range=[0, 1.0], row=1, col=2)
    studies = sorted({r["studies"] for r in rows})
    per_row = f"{studies[0]:,}" if len(studies) == 1 else f"{studies[0]:,}-{studies[-1]:,}"
    fig.update_layout(title=f"Figure 13: design rules on known truths ({per_row} simulated studies a row)",
                      height=460, width=1200, margin={"t": 70, "l": 60, "r": 20, "b": 80})
    return fig
