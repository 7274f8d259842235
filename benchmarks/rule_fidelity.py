"""Do the design rules keep their sign and size as the budget grows? The rules at every stored proxy configuration
and at the reference panels, side by side (no training: the runs of figure 12 and of the panels).

    python -m benchmarks.rule_fidelity                 # both axes; writes RULE_FIDELITY_FILE
    python -m benchmarks.rule_fidelity --space prism

For each axis (Prism: ``benchmarks/data/proxy_fidelity.json`` and ``reference_panel.json``, 13 shapes at 32k-128k
tokens and 262k; Hourglass: ``proxy_fidelity_hourglass.json`` and ``reference_panel_hourglass.json``, 17 shapes), the
space's default rules (``search_spaces.catalog``) are fitted by the rule model (``nas.stats.rules``) to each
configuration's runs and to the panel's, and each configuration's rule is judged against the panel's, the longer
budget, as ``nas rules --confirm`` judges it (``nas.stats.rule_checks.fidelity``: held, shrank, reversed, not
resolved). A width-48 configuration's shapes stand for the width-96 schedules they scale (its ``key_map``), so every
budget reads the same covariates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.reference_panel import HOURGLASS_FILE, REFERENCE_FILE, load_panel, panel_shapes
from nas.stats.rule_checks import fidelity
from nas.stats.rules import RuleFit, fit_rules
from nas.stats.scores import ShapeScores
from search_spaces.catalog import choose_rules, rule_catalog

DATA = Path(__file__).parent / "data"
RULE_FIDELITY_FILE = DATA / "rule_fidelity.json"
CONFIG_FILES = {"prism": DATA / "proxy_fidelity.json", "hourglass": DATA / "proxy_fidelity_hourglass.json"}
PANEL_FILES = {"prism": REFERENCE_FILE, "hourglass": HOURGLASS_FILE}


def scores_of(runs: list[dict[str, Any]], key_map: dict[str, str] | None = None) -> dict[str, ShapeScores]:
    """Completed runs as scores by the panel's (width-96) key."""
    by_key: dict[str, list[tuple[int, float]]] = {}
    for run in runs:
        if run.get("status") == "ok" and run.get("val_loss") is not None:
            key = (key_map or {}).get(run["key"], run["key"])
            by_key.setdefault(key, []).append((int(run["seed"]), float(run["val_loss"])))
    return {key: ShapeScores(key, tuple(range(len(v))), tuple(s for s, _ in v), tuple(loss for _, loss in v))
            for key, v in by_key.items()}


def fitted(scores: dict[str, ShapeScores], covariates: dict[str, tuple[float, ...]], names: tuple[str, ...],
           baseline: str, squares: dict[str, str] | None = None, at: dict[str, float] | None = None) -> RuleFit | None:
    base = scores.get(baseline)
    return fit_rules(scores, covariates, names, base.mean if base is not None else None, squares, at)


def optima_of(budget: str, fit: RuleFit | None, rules: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The U's bottom at one budget (d_model/L, its interval; None when unbounded)."""
    out = []
    for rule in rules:
        optimum = fit.optimum(rule.square_of, rule.name) if rule.square_of and fit is not None else None
        if optimum is not None and optimum.x is not None:
            bounded = optimum.low is not None and optimum.high is not None
            out.append({"budget": budget, "d_over_L": 2 ** optimum.x, "inside": optimum.inside,
                        "ci95": [2 ** optimum.low, 2 ** optimum.high] if bounded else None})
    return out


def estimate_row(fit: RuleFit | None, name: str) -> dict[str, Any]:
    if fit is None:
        return {"estimate": None, "ci95": None, "percent": None, "mdg": None, "verdict": "no fit"}
    e = fit.estimate(name)
    return {"estimate": e.estimate, "ci95": [e.low, e.high] if e.low is not None else None,
            "percent": e.percent(e.estimate), "mdg": e.mdg, "verdict": e.verdict,
            "confounded_with": e.confounded_with}


def axis(space: str) -> dict[str, Any]:
    """Every configuration's rules and the panel's, with the fidelity of each against the panel."""
    shapes = panel_shapes(False, space)
    baseline = shapes[0]
    rules = choose_rules(rule_catalog(space), None)
    names = tuple(rule.name for rule in rules)
    squares = {rule.name: rule.square_of for rule in rules if rule.square_of}
    covariates = {a.key(): tuple(rule.value(a, baseline) for rule in rules) for a in shapes}
    panel = load_panel(PANEL_FILES[space])
    panel_fit = fitted(scores_of(panel["runs"]), covariates, names, baseline.key(), squares)
    rows, optima = [], []
    configs = json.loads(CONFIG_FILES[space].read_text())["configs"]
    budgets = [(c["name"], c["train"]["tokens"], scores_of(c["runs"], c["key_map"])) for c in configs]
    for name, tokens, scores in budgets:
        fit = fitted(scores, covariates, names, baseline.key(), squares)
        # the panel read as --confirm reads a longer budget: a U's slope where this configuration read it
        at = {e.name: e.at for e in fit.estimates if e.at is not None} if fit else None
        longer = fitted(scores_of(panel["runs"]), covariates, names, baseline.key(), squares, at) if fit else None
        for rule in names:
            verdict = fidelity(fit.estimate(rule), longer.estimate(rule)) if fit and longer else "no fit"
            rows.append({"budget": name, "tokens": tokens, "rule": rule, "runs": fit.runs if fit else 0,
                         "shapes": fit.shapes if fit else 0, **estimate_row(fit, rule),
                         "fidelity at the panel": verdict})
        optima += optima_of(name, fit, rules)
    for rule in names:
        rows.append({"budget": f"reference panel ({panel['train']['tokens']:,} tokens)",
                     "tokens": panel["train"]["tokens"], "rule": rule, "runs": panel_fit.runs if panel_fit else 0,
                     "shapes": panel_fit.shapes if panel_fit else 0, **estimate_row(panel_fit, rule),
                     "fidelity at the panel": "-"})
    optima += optima_of("reference panel", panel_fit, rules)
    return {"space": space, "rules": list(names), "rows": rows, "optima": optima}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"### {result['space']}", "", "| budget | rule | estimate (nats/unit) [95 %] | % of loss | MDE | verdict "
             "| at the panel |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        interval = f"{r['estimate']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]" if r["ci95"] else "-"
        percent = f"{r['percent']:+.2f}" if r["percent"] is not None else "-"
        mdg = f"{r['mdg']:.4f}" if r["mdg"] is not None else "-"
        lines.append(f"| {r['budget']} | {r['rule']} | {interval} | {percent} | {mdg} | {r['verdict']} | "
                     f"{r['fidelity at the panel']} |")
    lines.append("")
    for o in result["optima"]:
        where = (f"d_model/L = {o['d_over_L']:.0f} [{o['ci95'][0]:.0f}, {o['ci95'][1]:.0f}]" if o["ci95"] else
                 "not resolved (the curvature's interval holds 0)")
        if o["ci95"] and not o["inside"]:
            where += " (beyond the trained range: an extrapolation, the curve still falling where it was trained)"
        lines.append(f"- the U's bottom at {o['budget']}: {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rule_fidelity", description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=("prism", "hourglass", "both"), default="both")
    parser.add_argument("--out", type=Path, default=RULE_FIDELITY_FILE)
    args = parser.parse_args(argv)
    spaces = ("prism", "hourglass") if args.space == "both" else (args.space,)
    results = [axis(space) for space in spaces]
    for result in results:
        print(markdown(result) + "\n")
    args.out.write_text(json.dumps({"axes": results}, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
