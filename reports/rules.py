"""The report's Design rules section: what each rule does, read across every run, at the proxy and at longer budgets.

Three figures, all read off the answer's rule fits (``nas.stats.answer.RuleAnswer``; nothing is fitted here):

- a **forest plot**: each rule's effect for the change its catalog names (``search_spaces.base.Rule.change``) in %
  of the baseline's loss, with its 95 % interval, one row per budget once ``nas rules --confirm`` has re-run it;
- **partial residuals**, one panel per rule: every shape's loss after its seeds' effects and the other rules'
  fitted contributions, against the rule's covariate, with the fitted line (the U's parabola for a rule and its
  square): how much of the rule's effect the shapes carry, and how much they scatter around it;
- **error distribution functions** (Radosavovic et al., "On network design spaces for visual recognition", ICCV
  2019): for each rule, the share of shapes whose seed-adjusted loss is at most ``e``, one curve per group of the
  rule's values (each value when it takes few, else its lower and upper half): a whole population, not one lucky
  shape, moves when a rule matters.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nas.stats.answer import RuleAnswer
from nas.stats.rules import TOO_FEW_SHAPES, RuleFit
from reports.frame import StudyData
from reports.page import Section, plot_text, table
from reports.rule_text import (
    change_pct,
    checks_text,
    effect_text,
    left_out_text,
    optimum_text,
    runs_text,
    spread_text,
)
from reports.summary import shape_label
from search_spaces.base import Rule

BUDGET_COLOURS = ("#22558c", "#d95f02", "#1b9e77", "#7570b3", "#e7298a")
FEW_VALUES = 4  # a rule with at most this many values gets one distribution function per value


def forest_figure(answer: RuleAnswer, rules: tuple[Rule, ...], proxy_label: str) -> go.Figure | None:
    """Each rule's effect with its interval, one marker a budget; None when no rule has a number (empty axes said
    nothing the table does not say better)."""
    fits = [(f"proxy ({proxy_label})", answer.proxy), *answer.budgets]
    fig = go.Figure()
    for i, (label, fit) in enumerate(fits):
        if fit is None:
            continue
        rows = [(rule, change_pct(rule, fit.estimate(rule.name))) for rule in rules]
        rows = [(rule, effect) for rule, effect in rows if effect is not None]
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[e[0] for _, e in rows], y=[plot_text(rule.change) for rule, _ in rows], mode="markers",
            name=plot_text(label), marker={"size": 10, "color": BUDGET_COLOURS[i % len(BUDGET_COLOURS)]},
            error_x={"type": "data", "symmetric": False, "array": [e[2] - e[0] for _, e in rows],
                     "arrayminus": [e[0] - e[1] for _, e in rows]},
            hovertemplate="%{y}: %{x:+.2f} % of the loss<extra>" + plot_text(label) + "</extra>"))
    if not fig.data:
        return None
    fig.add_vline(x=0, line={"color": "#888", "dash": "dot"})
    fig.update_xaxes(title_text="effect, % of the baseline's loss (95 % interval across shapes); positive: worse")
    fig.update_layout(height=140 + 60 * len(rules), title="Design rules: effect of each change",
                      margin={"t": 50, "l": 60, "r": 20, "b": 50}, scattermode="group")
    return fig


def residual_figure(data: StudyData, fit: RuleFit, rules: tuple[Rule, ...]) -> go.Figure | None:
    fitted = [rule for rule in rules if rule.name in fit.fitted and rule.name not in fit.pairs]
    if not fitted:
        return None
    fig = make_subplots(rows=1, cols=len(fitted), subplot_titles=[plot_text(r.name) for r in fitted],
                        horizontal_spacing=0.08)
    for col, rule in enumerate(fitted, start=1):
        x, r, keys = fit.partial_residuals(rule.name)  # a U's rule carries its square's part (RuleFit.curve)
        line_x = np.linspace(float(x.min()), float(x.max()), 60)
        line = fit.curve(rule.name, line_x)
        shift = float(np.mean(r - fit.curve(rule.name, x)))
        fig.add_trace(go.Scatter(x=x, y=r, mode="markers", showlegend=False,
                                 marker={"size": 6, "color": "#8a9bb0", "opacity": 0.8},
                                 text=[plot_text(shape_label(data, k)) for k in keys],
                                 hovertemplate="%{text}<br>%{x:.3g}: %{y:.4f}<extra></extra>"), row=1, col=col)
        if fit.estimate(rule.name).verdict != TOO_FEW_SHAPES:  # else an exact fit through the points: no effect
            fig.add_trace(go.Scatter(x=line_x, y=line + shift, mode="lines", showlegend=False,
                                     line={"color": "#22558c", "width": 2}), row=1, col=col)
        fig.update_xaxes(title_text=plot_text(rule.unit), row=1, col=col)
    fig.update_yaxes(title_text="loss less seeds and other rules", row=1, col=1)
    fig.update_layout(height=380, title="Partial residuals: each shape against each rule, with the fitted effect",
                      margin={"t": 70, "l": 60, "r": 20, "b": 50})
    return fig


def groups_of(values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The shapes split by a rule's value: each value when there are few, else below and from the value that splits
    them most evenly (a rule whose shapes pile up at one value still gets two groups)."""
    distinct = np.unique(np.round(values, 9))
    if len(distinct) <= FEW_VALUES:
        return [(f"= {v:.3g}", np.isclose(values, v)) for v in distinct]
    cut = min(distinct[1:], key=lambda v: abs(float(np.mean(values < v)) - 0.5))
    return [(f"< {cut:.3g}", values < cut), (f">= {cut:.3g}", values >= cut)]


def edf_figure(fit: RuleFit, rules: tuple[Rule, ...]) -> go.Figure | None:
    shown = [rule for rule in rules if rule.name in fit.fitted and rule.name not in fit.pairs]
    if not shown:
        return None
    keys = list(fit.adjusted)
    losses = np.array([fit.adjusted[k] for k in keys])
    fig = make_subplots(rows=1, cols=len(shown), subplot_titles=[plot_text(r.name) for r in shown],
                        shared_yaxes=True, horizontal_spacing=0.06)
    for col, rule in enumerate(shown, start=1):
        values = np.array([fit.covariates[k][fit.names.index(rule.name)] for k in keys])
        for i, (label, members) in enumerate(groups_of(values)):
            errors = np.sort(losses[members])
            # the step starts from 0 at the lowest loss: a group of one shape is a rise at its loss, not one point
            # that a line cannot draw
            fig.add_trace(go.Scatter(x=np.r_[errors[0], errors],
                                     y=np.r_[0.0, np.arange(1, len(errors) + 1) / len(errors)], mode="lines",
                                     line_shape="hv", name=plot_text(f"{rule.name} {label} ({len(errors)})"),
                                     line={"color": BUDGET_COLOURS[i % len(BUDGET_COLOURS)]}), row=1, col=col)
        # a step at the lowest or highest loss would sit on the axis' edge, where it cannot be seen
        pad = 0.05 * (float(np.ptp(losses)) or 1e-3)
        fig.update_xaxes(title_text="loss less its seeds' effects", row=1, col=col,
                         range=[float(losses.min()) - pad, float(losses.max()) + pad])
    fig.update_yaxes(title_text="share of shapes at or below", row=1, col=1, range=[0, 1.02])
    fig.update_layout(height=380, title="Error distribution functions of the shapes, split by each rule",
                      margin={"t": 70, "l": 60, "r": 20, "b": 50})
    return fig


def rows_of(fit: RuleFit, rules: tuple[Rule, ...], budget: str, answer: RuleAnswer) -> list[dict]:
    out = []
    for rule in rules:
        e = fit.estimate(rule.name)
        fidelity = "" if budget.startswith("proxy") else next(
            (c.verdict for c in answer.checks(rule.name) if c.budget == budget), "")
        out.append({"budget": budget, "rule": rule.name, "change": rule.change,
                    "effect of the change": effect_text(rule, e), "estimate (nats/unit)": e.estimate,
                    "MDE 80 % (nats/unit)": e.mdg, "verdict": e.verdict, "fidelity": fidelity,
                    "runs / shapes": f"{fit.runs} / {fit.shapes}"})
    return out


def rules_section(data: StudyData) -> Section:
    section = Section("rules", "Design rules",
                      "Read off what a kind of change does, read across every run (a mixed model: the rules as "
                      "fixed effects, a random deviation per shape, seed effects): each rule's effect with its 95 % "
                      "interval across shapes, and, once `nas rules --confirm` re-ran a designed sample at a longer "
                      "budget, whether it held there.")
    rules = data.rules()
    answer = data.answer(rules).rules
    if answer is None or answer.proxy is None:
        section.empty = ("no design rules to read: " + (
            "this space declares none" if not rules else "fewer than 3 shapes with a completed training"
            if len(data.scores) < 3 else "too few runs for the study's seeds and rules"))
        return section
    fit = answer.proxy
    rows = rows_of(fit, rules, f"proxy ({data.preset})", answer)
    for label, other in answer.budgets:
        if other is not None:
            rows += rows_of(other, rules, label, answer)
    section.html = table(rows, css="board", formats={"estimate (nats/unit)": "{:+.4f}",
                                                     "MDE 80 % (nats/unit)": "{:.4f}"})
    figures = (forest_figure(answer, rules, data.preset), residual_figure(data, fit, rules), edf_figure(fit, rules))
    for figure in figures:
        if figure is not None:
            section.figures.append(figure)
    section.notes.append(f"At this proxy: {runs_text(fit)}, {fit.seeds} seed{'s' if fit.seeds != 1 else ''}; "
                         f"{spread_text(fit)}.")
    left = left_out_text(answer)
    if left:
        section.notes.append(left[0].upper() + left[1:] + ".")
    for rule in rules:
        if rule.square_of and fit.pairs.get(rule.name) == rule.square_of:
            linear = next((r for r in rules if r.name == rule.square_of), None)
            bottom = optimum_text(fit.optimum(rule.square_of, rule.name), linear)
            section.notes.append("The width-depth U: " + (bottom + " at this proxy (Fieller's 95 % interval)."
                                                          if bottom else "its bottom is not resolved at this proxy."))
        elif not answer.budgets:
            continue
        else:
            section.notes.append(f"{rule.name}: {checks_text(rule, answer.checks(rule.name))}.")
    return section
