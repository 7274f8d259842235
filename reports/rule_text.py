"""The design rules in words: one sentence a rule, with its budget and its fidelity at a longer one.

A rule's effect is stated for the change its catalog names (``search_spaces.base.Rule.change``): ``halving the first
layer's heads: +1.47 % [+0.87, +2.07] of the loss at this proxy, 200 runs over 129 shapes; not yet checked at a longer
budget``, the per-unit estimate of ``nas.stats.rules`` times ``Rule.per_change``, in % of the baseline's mean loss. A
rule read with its square (the width-depth U) is stated as its slope at the shapes' mean value, and the U, once its
curvature is resolved, as its bottom with Fieller's interval.
"""

from __future__ import annotations

import math

from nas.stats.answer import RuleAnswer, RuleCheck
from nas.stats.rules import MIN_SHAPE_DF, RESOLVED, TOO_FEW_SHAPES, Optimum, RuleEstimate, RuleFit
from search_spaces.base import Rule

AT_PROXY = "at this proxy"


def change_pct(rule: Rule, estimate: RuleEstimate) -> tuple[float, float, float] | None:
    """The rule's change (``Rule.per_change`` units) as % of the baseline's loss: (effect, low, high)."""
    if estimate.estimate is None or estimate.low is None or estimate.high is None or not estimate.baseline_loss:
        return None
    values = [100 * rule.per_change * v / estimate.baseline_loss for v in (estimate.estimate, estimate.low,
                                                                            estimate.high)]
    return values[0], min(values[1:]), max(values[1:])


def effect_text(rule: Rule, estimate: RuleEstimate) -> str:
    """``+1.47 % [+0.87, +2.07] of the loss``; why there is no number otherwise."""
    if estimate.confounded_with is not None:
        return f"confounded with {estimate.confounded_with} (never varied apart from it: no number)"
    if estimate.verdict == TOO_FEW_SHAPES:
        return (f"too few shapes to say ({estimate.df} besides the rules and the intercept; a rule's interval needs "
                f"{MIN_SHAPE_DF})")
    effect = change_pct(rule, estimate)
    if effect is None:
        return estimate.verdict
    return f"{effect[0]:+.2f} % [{effect[1]:+.2f}, {effect[2]:+.2f}] of the loss"


def runs_text(fit: RuleFit) -> str:
    return f"{fit.runs} runs over {fit.shapes} shapes"


def spread_text(fit: RuleFit) -> str:
    """The variance components as a reader may take them: apart when some shape has two runs, else together; the
    shapes' spread not at all where too few shapes are left beside the rules (``RuleFit.spread_read``)."""
    if not fit.spread_read:
        more = MIN_SHAPE_DF - fit.shape_df
        unread = (f"the shapes' spread beyond the rules not read ({fit.shapes} shapes for {len(fit.fitted)} "
                  f"rule{'s' if len(fit.fitted) != 1 else ''} and the intercept: {more} more "
                  f"shape{'s' if more != 1 else ''} would read it)")
        return unread + (f", run sd {fit.sigma:.3f} nats" if fit.runs > fit.shapes else "")
    if fit.runs > fit.shapes:
        return f"shape sd beyond the rules {fit.tau:.3f} nats, run sd {fit.sigma:.3f}"
    return (f"one run a shape: the shapes' deviation and a run's luck read together, sd "
            f"{math.hypot(fit.tau, fit.sigma):.3f} nats")


def checks_text(rule: Rule, checks: tuple[RuleCheck, ...]) -> str:
    """``held at cpu-long (+0.62 % [+0.11, +1.13] of the loss)`` for each longer budget, or that there is none."""
    if not checks:
        return "not yet checked at a longer budget"
    return "; ".join(f"{c.verdict} at {c.budget} ({effect_text(rule, c.estimate)})" for c in checks)


def at_text(rule: Rule, estimate: RuleEstimate) -> str:
    """`` (at d_model/L = 32, the shapes' mean)`` for a rule read with its square (its slope there), else ``""``."""
    if estimate.at is None:
        return ""
    where = rule.value_text(estimate.at) if rule.value_text else f"{rule.name} = {estimate.at:.3g}"
    whose = "the proxy's shapes'" if estimate.proxy_at else "the shapes'"
    return f" (at {where}, {whose} mean)"


def rule_sentence(rule: Rule, fit: RuleFit, answer: RuleAnswer | None = None) -> str:
    """One rule, at this proxy and every longer budget (module docstring)."""
    estimate = fit.estimate(rule.name)
    checks = answer.checks(rule.name) if answer is not None else ()
    return (f"{rule.change}{at_text(rule, estimate)}: {effect_text(rule, estimate)} {AT_PROXY}, {runs_text(fit)}; "
            f"{checks_text(rule, checks)}")


def optimum_text(optimum: Optimum | None, rule: Rule | None = None) -> str | None:
    """``lowest near d_model/L = 215 [150, 310]`` for a U (in ``rule``'s words: ``Rule.value_text``); that it is
    still falling (rising) at the largest (smallest) value trained when its bottom lies beyond them; None when its
    bottom is not resolved."""
    if optimum is None or optimum.x is None or optimum.low is None or optimum.high is None:
        return None
    show = rule.value_text if rule is not None and rule.value_text else (lambda v: f"{v:.3g}")
    if optimum.x > optimum.highest:
        return f"still falling at the largest value trained ({show(optimum.highest)}): its bottom lies beyond it"
    if optimum.x < optimum.lowest:
        return f"still rising from the smallest value trained ({show(optimum.lowest)}): its bottom lies below it"
    low = show(optimum.low).split("= ")[-1] if optimum.low >= optimum.lowest else f"below {show(optimum.lowest)}"
    high = show(optimum.high).split("= ")[-1] if optimum.high <= optimum.highest else \
        f"beyond {show(optimum.highest).split('= ')[-1]}"
    return f"lowest near {show(optimum.x)} [{low}, {high}]"


def u_sentence(square: Rule, answer: RuleAnswer, rules: tuple[Rule, ...] = ()) -> str | None:
    """The width-depth U of a rule and its square: its bottom at this proxy and at each longer budget (or that it bends
    down, or that its bottom cannot be placed); None unless the proxy resolves its curvature."""
    fit = answer.proxy
    if fit is None or fit.pairs.get(square.name) != square.square_of or fit.estimate(square.name).verdict != RESOLVED:
        return None
    linear = next((r for r in rules if r.name == square.square_of), None)
    bottom = optimum_text(fit.optimum(square.square_of, square.name), linear)
    curvature = fit.estimate(square.name).estimate
    if bottom is None:  # resolved, so said (it was left out): the curve has a top, or a bottom it cannot place
        shape = ("bends down, an inverted U: the loss is highest inside the trained range and lowest at its ends"
                 if curvature is not None and curvature < 0 else "is a U whose bottom this study cannot place")
    else:
        shape = f"is a U, {bottom}"
    longer = []
    for check in answer.checks(square.name):
        other = dict(answer.budgets)[check.budget]
        there = optimum_text(other.optimum(square.square_of, square.name), linear) if other is not None else None
        longer.append(f"curvature {check.verdict} at {check.budget}" + (f", {there}" if there else ""))
    tail = "; ".join(longer) or "not yet checked at a longer budget"
    return f"the width-depth curve {shape} {AT_PROXY}, {runs_text(fit)}; {tail}"


def resolved_sentences(answer: RuleAnswer | None, rules: tuple[Rule, ...]) -> list[str]:
    """One sentence per rule resolved at the proxy (the U as its bottom), for the answer's short forms."""
    if answer is None or answer.proxy is None:
        return []
    fit, out = answer.proxy, []
    for rule in rules:
        if rule.name not in fit.names:
            continue
        if rule.square_of is not None:  # the curvature: the U's bottom, when the U is resolved
            sentence = u_sentence(rule, answer, rules)
            if sentence:
                out.append(sentence)
        elif fit.estimate(rule.name).verdict == RESOLVED:
            out.append(rule_sentence(rule, fit, answer))
    return out


def estimate_json(rule: Rule, estimate: RuleEstimate) -> dict[str, object]:
    """One rule's numbers as ``nas rules --format json`` gives them (nats per unit; None where there is none)."""
    effect = change_pct(rule, estimate)
    interval = [estimate.low, estimate.high] if estimate.low is not None else None
    return {"name": rule.name, "unit": rule.unit, "estimate": estimate.estimate, "ci95": interval,
            "percent": estimate.percent(estimate.estimate), "mdg": estimate.mdg, "verdict": estimate.verdict,
            "confounded_with": estimate.confounded_with, "carried_by": estimate.carried_by, "sd": estimate.sd,
            "df": estimate.df or None,
            "change": rule.change, "change_percent": effect[0] if effect else None,
            "change_ci95": [effect[1], effect[2]] if effect else None}


def fit_json(fit: RuleFit | None, rules: tuple[Rule, ...]) -> dict[str, object]:
    """A fit's size, its variance components, every rule and the U's bottom (in d_model/L)."""
    if fit is None:
        return {"runs": None, "shapes": None, "rules": []}
    optima = []
    for rule in rules:
        if rule.square_of and fit.pairs.get(rule.name) == rule.square_of:
            optimum = fit.optimum(rule.square_of, rule.name)
            if optimum is not None and optimum.x is not None:
                bounded = optimum.low is not None and optimum.high is not None
                optima.append({"rule": rule.square_of, "log2_d_over_L": optimum.x, "d_over_L": 2 ** optimum.x,
                               "d_over_L_ci95": [2 ** optimum.low, 2 ** optimum.high] if bounded else None,
                               "inside_the_trained_range": optimum.inside,
                               "trained_range": [2 ** optimum.lowest, 2 ** optimum.highest]})
    separable = fit.runs > fit.shapes  # one run a shape: only tau^2 + sigma^2 is identified
    read = fit.spread_read  # too few shapes beside the rules: tau is the prior's, not the data's
    return {"runs": fit.runs, "shapes": fit.shapes, "seeds": fit.seeds, "shape_df": fit.shape_df,
            "tau": fit.tau if separable and read else None, "sigma": fit.sigma if separable else None,
            "sd_shape_and_run": math.hypot(fit.tau, fit.sigma) if read else None,
            "baseline_loss": fit.baseline_loss, "rules": [estimate_json(r, fit.estimate(r.name)) for r in rules],
            "optimum": optima}


def left_out_text(answer: RuleAnswer | None) -> str | None:
    """What the proxy's fit could not read (pruned or failed trials: their final scores are missing), and the rules
    on which the left-out shapes differ from the read ones (``nas.stats.rule_checks.selection_imbalance``)."""
    if answer is None or not answer.left_out:
        return None
    counted = " and ".join(f"{n} {why} trial{'s' if n != 1 else ''}" for why, n in answer.left_out.items())
    text = f"left out of the fit: {counted} (no final score)"
    if answer.leaning:
        named = ", ".join(f"{name} (p {p:.1g})" for name, p in answer.leaning.items())
        text += (f"; the left-out shapes differ from the read ones in {named}: the pruner stops a trial on its early "
                 "loss, so these rules are read on the survivors, milder than they are or flipped")
    return text


def rules_json(study: str, preset: str, answer: RuleAnswer | None, rules: tuple[Rule, ...]) -> dict[str, object]:
    """``nas rules --format json``: the study's rules at its proxy, then at every longer budget with each rule's
    fidelity verdict (``nas.stats.rule_checks.fidelity``)."""
    proxy = answer.proxy if answer is not None else None
    out: dict[str, object] = {"study": study, "preset": preset, **fit_json(proxy, rules), "fidelity": [],
                              "left_out": dict(answer.left_out) if answer is not None else {},
                              "left_out_differ_in": dict(answer.leaning) if answer is not None else {}}
    for label, fit in (answer.budgets if answer is not None else ()):
        entry = {"budget": label, **fit_json(fit, rules)}
        verdicts = {rule.name: next((c.verdict for c in answer.checks(rule.name) if c.budget == label), None)
                    for rule in rules}
        for row in entry["rules"]:  # type: ignore[attr-defined]
            row["fidelity"] = verdicts.get(row["name"])
        out["fidelity"].append(entry)  # type: ignore[attr-defined]
    return out


def signed(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def table_lines(fit: RuleFit, rules: tuple[Rule, ...], title: str, answer: RuleAnswer | None = None,
                budget: str | None = None) -> list[str]:
    """One budget's rules as a table: estimate (nats per unit) with its 95 % interval, % of the baseline's loss, the
    minimum detectable effect, the verdict and, at a longer budget, the fidelity."""
    seeds = f"{fit.seeds} seed{'s' if fit.seeds != 1 else ''}"
    spread = spread_text(fit)
    head = f"{title}: {fit.runs} runs over {fit.shapes} shapes and {seeds}; {spread}"
    width = max([len(r.name) for r in rules] + [4])
    unit_width = max([len(r.unit) for r in rules] + [4])
    lines = [head, f"  {'rule':<{width}}  {'unit':<{unit_width}}  {'estimate [95 %] (nats/unit)':<31}  "
                   f"{'% loss':>7}  {'MDE 80 %':>8}  verdict" + ("  fidelity" if budget else "")]
    for rule in rules:
        e = fit.estimate(rule.name)
        if e.estimated:
            number = f"{signed(e.estimate)} [{signed(e.low)}, {signed(e.high)}]"
            share, mdg = f"{e.percent(e.estimate):+.2f}" if e.baseline_loss else "-", f"{e.mdg:.4f}"
        else:
            number, share, mdg = ("(with " + str(e.confounded_with) + ")" if e.confounded_with else "-"), "-", "-"
        verdict = e.verdict
        fidelity_verdict = ""
        if budget and answer is not None:
            fidelity_verdict = next((f"  {c.verdict}" for c in answer.checks(rule.name) if c.budget == budget), "")
        lines.append(f"  {rule.name:<{width}}  {rule.unit:<{unit_width}}  {number:<31}  {share:>7}  {mdg:>8}  "
                     f"{verdict}{fidelity_verdict}")
    for rule in rules:
        e = fit.estimate(rule.name)
        if e.carried_by is not None:
            lines.append(f"  {rule.name}: carried by the shape {e.carried_by} (more than half of the rule's spread "
                         "over the shapes, or the fit without it does not resolve the rule)")
        if e.at is not None:
            lines.append(f"  {rule.name}: the slope{at_text(rule, e)}, fitted with its square")
        if rule.square_of and fit.pairs.get(rule.name) == rule.square_of:
            linear = next((r for r in rules if r.name == rule.square_of), None)
            bottom = optimum_text(fit.optimum(rule.square_of, rule.name), linear)
            lines.append(f"  the width-depth U: {bottom}" if bottom else
                         "  the width-depth U: its bottom is not resolved (the curvature's interval holds 0 or the "
                         "curve opens downwards)")
    return lines
