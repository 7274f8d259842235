"""The rule model (``nas.stats.rules``): agreement with statsmodels' MixedLM, verdicts, the U's optimum, fidelity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nas.stats.rule_checks import HELD, REVERSED, SHRANK, fidelity
from nas.stats.rules import CONFOUNDED_VERDICT, NOT_RESOLVED, NOT_VARIED, RESOLVED, RuleEstimate, fit_rules
from nas.stats.scores import ShapeScores


def planted(rng: np.random.Generator, beta: tuple[float, ...], tau: float, sigma: float, shapes: int = 40,
            seeds: int = 6, columns=None) -> tuple[dict[str, ShapeScores], dict[str, list[float]]]:
    """A study of ``shapes`` shapes on 1-4 of ``seeds`` seeds each, two covariates (a count 0-6 and a continuous
    one), scored ``u_seed + x'beta + m_shape + e`` (the rule model's own form)."""
    seed_effects = rng.normal(0, 0.1, seeds)
    scores, covariates = {}, {}
    for s in range(shapes):
        x = columns(s, rng) if columns else [float(rng.integers(0, 7)), float(rng.uniform(-2, 0))]
        level = 3.0 + float(np.dot(x, beta)) + rng.normal(0, tau)
        chosen = sorted(rng.choice(seeds, size=int(rng.integers(1, 5)), replace=False).tolist())
        losses = tuple(level + seed_effects[i] + rng.normal(0, sigma) for i in chosen)
        key = f"shape{s}"
        scores[key] = ShapeScores(key, tuple(range(len(chosen))), tuple(int(i) for i in chosen), losses)
        covariates[key] = x
    return scores, covariates


def statsmodels_fit(scores: dict[str, ShapeScores], covariates: dict[str, list[float]]):
    import pandas as pd
    import statsmodels.formula.api as smf

    rows = [{"shape": k, "seed": str(seed), "y": loss, "a": covariates[k][0], "b": covariates[k][1]}
            for k, s in scores.items() for seed, loss in zip(s.seeds, s.losses)]
    frame = pd.DataFrame(rows)
    return smf.mixedlm("y ~ 0 + C(seed) + a + b", frame, groups=frame["shape"]).fit(reml=True)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_estimates_agree_with_statsmodels_mixedlm_on_planted_designs(seed):
    rng = np.random.default_rng(seed)
    scores, covariates = planted(rng, (0.01, -0.04), tau=0.04, sigma=0.08)
    ours = fit_rules(scores, covariates, ["a", "b"], 3.0)
    theirs = statsmodels_fit(scores, covariates)
    assert ours is not None
    for name in ("a", "b"):
        assert ours.estimate(name).estimate == pytest.approx(theirs.fe_params[name], abs=1e-4)
    assert ours.tau == pytest.approx(math.sqrt(float(theirs.cov_re.iloc[0, 0])), abs=2e-3)
    assert ours.sigma == pytest.approx(math.sqrt(theirs.scale), abs=2e-3)


def test_no_shape_spread_gives_ordinary_least_squares_and_a_finite_interval():
    """Planted with tau = 0, REML puts the spread at its boundary: the estimate is least squares with seed effects,
    and the interval is finite and no shorter than least squares' own (it knows tau could be larger)."""
    rng = np.random.default_rng(7)
    scores, covariates = planted(rng, (0.0, -0.03), tau=0.0, sigma=0.1, shapes=60)
    fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
    assert fit is not None and fit.tau == 0.0
    rows = [(k, seed, loss) for k, s in scores.items() for seed, loss in zip(s.seeds, s.losses)]
    seeds = sorted({seed for _, seed, _ in rows})
    x = np.array([[float(seed == i) for i in seeds] + list(covariates[k]) for k, seed, _ in rows])
    y = np.array([loss for _, _, loss in rows])
    beta, residual = np.linalg.lstsq(x, y, rcond=None)[:2]
    ols_sd = np.sqrt(np.diag(residual[0] / (len(y) - x.shape[1]) * np.linalg.inv(x.T @ x)))
    for i, name in enumerate(("a", "b")):
        estimate = fit.estimate(name)
        assert estimate.estimate == pytest.approx(beta[len(seeds) + i], abs=1e-9)
        assert math.isfinite(estimate.sd) and estimate.sd >= ols_sd[len(seeds) + i] * 0.999


def test_a_planted_rule_is_resolved_and_a_null_one_is_not():
    rng = np.random.default_rng(11)
    scores, covariates = planted(rng, (0.0, -0.06), tau=0.02, sigma=0.06, shapes=80)
    fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
    a, b = fit.estimate("a"), fit.estimate("b")
    assert b.verdict == RESOLVED and b.low < -0.06 < b.high
    assert a.verdict == NOT_RESOLVED and a.low < 0 < a.high
    assert b.mdg == pytest.approx((1.9905 + 0.8464) * b.sd, rel=1e-3)  # t_{0.975,77} + t_{0.8,77}
    assert b.percent(b.estimate) == pytest.approx(100 * b.estimate / 3.0)


def test_a_rule_never_varied_apart_from_another_is_confounded_and_gets_no_number():
    rng = np.random.default_rng(3)
    scores, covariates = planted(rng, (0.02, 0.0), tau=0.02, sigma=0.06)
    with_copy = {k: [x[0], 2 * x[0] + 1, x[1]] for k, x in covariates.items()}  # the second is the first, rescaled
    fit = fit_rules(scores, with_copy, ["a", "twice_a", "b"], 3.0)
    assert fit.estimate("a").verdict == CONFOUNDED_VERDICT and fit.estimate("a").confounded_with == "twice_a"
    assert fit.estimate("twice_a").confounded_with == "a" and fit.estimate("twice_a").estimate is None
    assert fit.estimate("b").estimated and fit.fitted == ("b",)


def test_a_constant_rule_is_not_varied_and_the_others_still_fit():
    rng = np.random.default_rng(4)
    scores, covariates = planted(rng, (0.02, 0.0), tau=0.02, sigma=0.06)
    fit = fit_rules(scores, {k: [x[0], 1.0] for k, x in covariates.items()}, ["a", "constant"], 3.0)
    assert fit.estimate("constant").verdict == NOT_VARIED and fit.estimate("a").estimated


def test_a_rule_only_the_seeds_vary_is_confounded_with_the_seed_effects():
    scores = {f"s{i}": ShapeScores(f"s{i}", (0,), (i % 2,), (3.0 + 0.01 * i,)) for i in range(6)}
    fit = fit_rules(scores, {f"s{i}": [float(i % 2), float(i)] for i in range(6)}, ["by_seed", "i"], 3.0)
    assert fit.estimate("by_seed").confounded_with == "the seed effects"


def test_too_few_shapes_is_no_fit():
    scores = {k: ShapeScores(k, (0, 1), (0, 1), (3.0, 3.1)) for k in ("a", "b")}
    assert fit_rules(scores, {"a": [0.0], "b": [1.0]}, ["x"]) is None


def u_columns(s: int, rng: np.random.Generator) -> list[float]:
    x = 2.0 + 6.0 * (s % 12) / 11
    return [x, x * x]


def test_a_resolved_curvature_that_bends_down_is_said_not_left_out():
    """A resolved curvature with its curve opening downwards has no bottom: the answer's 'Resolved:' line left it
    out although the table called it resolved."""
    from nas.stats.answer import RuleAnswer
    from reports.rule_text import resolved_sentences
    from search_spaces.base import Rule

    scores, covariates = planted(np.random.default_rng(3), (0.14, -0.01), tau=0.005, sigma=0.01, shapes=72,
                                 columns=u_columns)
    fit = fit_rules(scores, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"})
    assert fit.estimate("sq").verdict == RESOLVED and fit.estimate("sq").estimate < 0
    rules = (Rule("lin", "unit", "x", "raising x", 1.0, lambda a, b: 0.0),
             Rule("sq", "unit^2", "x^2", "x^2", 1.0, lambda a, b: 0.0, square_of="lin"))
    sentences = resolved_sentences(RuleAnswer(fit), rules)
    assert any(s.startswith("the width-depth curve bends down, an inverted U") for s in sentences), sentences


def test_fieller_interval_of_a_planted_u_covers_its_bottom():
    """loss = 0.01 (x - 7)^2 + ...: the bottom at x = 7 (d_model/L = 128); over 40 studies the 95 % interval covers
    it in all but a few (200 covered 0.95), and a flat curve has no bounded interval."""
    covered = 0
    for seed in range(40):
        scores, covariates = planted(np.random.default_rng(seed), (-0.14, 0.01), tau=0.01, sigma=0.05, shapes=72,
                                     columns=u_columns)
        optimum = fit_rules(scores, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"}).optimum("lin", "sq")
        covered += optimum.low is not None and optimum.low < 7.0 < optimum.high
    assert covered >= 34
    flat, covariates = planted(np.random.default_rng(6), (0.0, 0.0), tau=0.01, sigma=0.05, shapes=24,
                               columns=u_columns)
    optimum = fit_rules(flat, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"}).optimum("lin", "sq")
    assert optimum.low is None or optimum.x is None or optimum.high - optimum.low > 10  # at most a guess


def test_partial_residuals_carry_the_rule_line():
    rng = np.random.default_rng(8)
    scores, covariates = planted(rng, (0.03, -0.05), tau=0.0, sigma=0.001, shapes=30)
    fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
    x, r, keys = fit.partial_residuals("a")
    slope = np.polyfit(x, r, 1)[0]
    assert slope == pytest.approx(0.03, abs=2e-3) and len(keys) == 30


def estimate(value: float, sd: float) -> RuleEstimate:
    return RuleEstimate("x", RESOLVED, value, sd, value - 1.96 * sd, value + 1.96 * sd, 2.8 * sd, 100, 3.0)


@pytest.mark.parametrize("proxy, longer, verdict", [
    ((-0.04, 0.01), (-0.035, 0.01), HELD),
    ((-0.04, 0.005), (-0.01, 0.004), SHRANK),
    ((-0.04, 0.01), (0.03, 0.01), REVERSED),
    ((-0.04, 0.01), (-0.02, 0.015), NOT_RESOLVED),
    ((0.02, 0.005), (0.05, 0.01), HELD),
    ((-0.04, 0.005), (0.03, 0.028), NOT_RESOLVED),  # its sign flipped, the longer budget resolving nothing
])
def test_fidelity_verdicts(proxy, longer, verdict):
    assert fidelity(estimate(*proxy), estimate(*longer)) == verdict


def test_fidelity_of_a_rule_the_proxy_did_not_resolve_is_nothing_to_check():
    from nas.stats.rule_checks import NOTHING_TO_CHECK

    assert fidelity(RuleEstimate("x", CONFOUNDED_VERDICT), estimate(0.1, 0.01)) == NOTHING_TO_CHECK
    unresolved = RuleEstimate("x", NOT_RESOLVED, 0.01, 0.01, -0.01, 0.03, 0.03, 100, 3.0)
    assert fidelity(unresolved, estimate(0.1, 0.01)) == NOTHING_TO_CHECK
    # no estimate at the longer budget: not checked there, and why ("not resolved" said it was checked)
    assert fidelity(estimate(0.1, 0.01), RuleEstimate("x", CONFOUNDED_VERDICT)) == "not checked (confounded)"
    assert fidelity(estimate(0.1, 0.01), RuleEstimate("x", "too few shapes")) == "not checked (too few shapes)"


def test_a_rule_fitted_with_its_square_is_read_as_its_slope_at_the_shapes_mean():
    """The coefficient of x beside x^2 is the slope at x = 0, outside any study: the U's square enters centred at the
    shapes' mean, so the rule reads as its slope there, b1 + 2 b2 x_bar of the uncentred fit with the variance of
    that combination; the curvature, the bottom and its interval are the same fit's."""
    scores, covariates = planted(np.random.default_rng(9), (-0.14, 0.01), tau=0.01, sigma=0.05, shapes=48,
                                 columns=u_columns)
    raw = fit_rules(scores, covariates, ["lin", "sq"], 3.0)
    read = fit_rules(scores, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"})
    x_bar = float(np.mean([covariates[k][0] for k in scores]))
    b1, b2 = raw.estimate("lin").estimate, raw.estimate("sq").estimate
    slope = read.estimate("lin")
    assert slope.at == pytest.approx(x_bar) and slope.estimate == pytest.approx(b1 + 2 * b2 * x_bar)
    v = raw.covariance
    assert slope.sd == pytest.approx(np.sqrt(v[0, 0] + 4 * x_bar * v[0, 1] + 4 * x_bar**2 * v[1, 1]), rel=1e-6)
    assert slope.sd < raw.estimate("lin").sd  # read where the shapes are, not extrapolated to 0
    assert read.estimate("sq").estimate == pytest.approx(b2)
    bottom = read.optimum("lin", "sq")
    assert bottom.x == pytest.approx(-b1 / (2 * b2)) and bottom.lowest == 2.0 and bottom.highest == 8.0
    assert raw.optimum("lin", "sq") is None  # without the pair declared there is no U to read
    there = fit_rules(scores, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"}, at={"lin": 5.0})
    assert there.estimate("lin").estimate == pytest.approx(b1 + 10 * b2) and there.estimate("lin").proxy_at
    from reports.rule_text import at_text
    from search_spaces.hourglass_rules import HOURGLASS_RULES

    rule = next(r for r in HOURGLASS_RULES if r.name == "log2_d_over_L")
    assert at_text(rule, there.estimate("lin")) == " (at d_model/L = 32, the proxy's shapes' mean)"
    assert at_text(rule, slope).endswith(", the shapes' mean)")


def test_a_narrow_range_is_not_read_as_the_square_confounded_with_its_rule():
    """Over log2(d/L) in [6, 7], x^2 is within 1e-4 of a line in x: uncentred, both would read as confounded with
    each other; centred at the mean they are told apart."""
    def narrow(s: int, rng: np.random.Generator) -> list[float]:
        x = 6.0 + (s % 8) / 7
        return [x, x * x]

    scores, covariates = planted(np.random.default_rng(2), (-0.05, 0.0), tau=0.01, sigma=0.03, shapes=40,
                                 columns=narrow)
    assert fit_rules(scores, covariates, ["lin", "sq"], 3.0).estimate("lin").verdict == CONFOUNDED_VERDICT
    read = fit_rules(scores, covariates, ["lin", "sq"], 3.0, squares={"sq": "lin"})
    assert read.estimate("lin").verdict == RESOLVED and read.estimate("sq").estimated


def test_a_rule_read_from_too_few_shapes_gets_no_number():
    """With S - 1 - R < 4 the flat prior on tau leaves the interval to the grid's end: no number is given."""
    from nas.stats.rules import TOO_FEW_SHAPES

    scores, covariates = planted(np.random.default_rng(1), (0.02, -0.03), tau=0.02, sigma=0.05, shapes=6)
    fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
    assert {e.verdict for e in fit.estimates} == {TOO_FEW_SHAPES} and fit.estimate("a").estimate is None
    scores, covariates = planted(np.random.default_rng(1), (0.02, -0.03), tau=0.02, sigma=0.05, shapes=7)
    assert fit_rules(scores, covariates, ["a", "b"], 3.0).estimate("a").estimated  # 7 - 1 - 2 = 4


def test_the_shapes_spread_beyond_the_rules_is_not_stated_where_too_few_shapes_leave_it_unread():
    """3 shapes, 2 rules: no shape degree of freedom is left, and ``nas rules`` printed "shape sd beyond the rules
    0.885 nats" for shapes whose means lie within 0.05 nats (0.000 for nearly the same runs)."""
    from reports.rule_text import fit_json, spread_text

    for shapes, read in ((3, False), (6, False), (7, True)):
        scores, covariates = planted(np.random.default_rng(1), (0.02, -0.03), tau=0.02, sigma=0.05, shapes=shapes)
        fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
        assert fit.spread_read is read and fit.shape_df == shapes - 3
        text, numbers = spread_text(fit), fit_json(fit, ())
        assert ("shape sd beyond the rules" in text) is read and ("tau" in text) is False
        assert (numbers["tau"] is None and numbers["sd_shape_and_run"] is None) is not read
        if not read:
            more = {3: "4 more shapes", 6: "1 more shape"}[shapes]
            assert text.startswith(f"the shapes' spread beyond the rules not read ({shapes} shapes for 2 rules and the "
                                   f"intercept: {more} would read it)")


def test_as_many_rules_as_shapes_is_too_few_shapes_for_each_not_confounded_and_none_gets_a_number():
    """8 shapes, 7 rules: every column is a combination of the others, which the fit called "confounded" for six of
    them and then gave the seventh an interval from a model without them."""
    from nas.stats.rules import TOO_FEW_SHAPES

    rng = np.random.default_rng(5)
    names = [f"r{i}" for i in range(7)]
    covariates = {}
    for i in range(8):  # r0-r5 span three directions between them; r6 is its own
        a, b, c, d = (float(v) for v in rng.normal(0, 1, 4))
        covariates[f"s{i}"] = [a, b, c, a + b, b + c, a + c, d]
    # every shape trained once, on seed 0 (a short search's members)
    scores = {k: ShapeScores(k, (0,), (0,), (3.0 + 0.02 * sum(x) + float(rng.normal(0, 0.02)),))
              for k, x in covariates.items()}
    fit = fit_rules(scores, covariates, names, 3.0)
    assert {e.verdict for e in fit.estimates} == {TOO_FEW_SHAPES}, [e.verdict for e in fit.estimates]
    assert all(e.estimate is None for e in fit.estimates) and fit.estimate("r0").df == 8 - 1 - 7


def test_the_interval_does_not_move_with_the_grids_end_once_there_are_enough_shapes(monkeypatch):
    import nas.stats.rule_reml as reml  # the REML the rule fit uses

    scores, covariates = planted(np.random.default_rng(4), (0.02, -0.03), tau=0.02, sigma=0.05, shapes=7)
    before = fit_rules(scores, covariates, ["a", "b"], 3.0).estimate("b").sd
    monkeypatch.setattr(reml, "LOG_LAMBDA_GRID", np.arange(-15.0, 9.0 + 1e-9, 0.5))
    assert fit_rules(scores, covariates, ["a", "b"], 3.0).estimate("b").sd == pytest.approx(before, rel=0.05)


def test_the_interval_is_at_least_statsmodels_plug_in_standard_error():
    """statsmodels' standard errors are the plug-in ones at the REML lambda; ours average over lambda's posterior,
    so they are at least as wide (and equal when the posterior is concentrated)."""
    scores, covariates = planted(np.random.default_rng(0), (0.01, -0.04), tau=0.04, sigma=0.08)
    ours = fit_rules(scores, covariates, ["a", "b"], 3.0)
    theirs = statsmodels_fit(scores, covariates)
    for name in ("a", "b"):
        assert ours.estimate(name).sd >= 0.999 * float(theirs.bse[name])
        assert ours.estimate(name).sd <= 2.0 * float(theirs.bse[name])


def test_the_designed_sample_spans_the_rules_and_spreads_before_it_repeats():
    from nas.stats.rule_design import design_sample

    # a grid of (a, b) values, four shapes at each; the baseline at the origin
    covariates = {f"s{i}": (float(i % 5), float((i // 5) % 3)) for i in range(60)}
    covariates["base"] = (0.0, 0.0)
    chosen = design_sample(covariates, "base", 8, list(covariates), {"s7": 3})
    assert chosen[0] == "base" and len(chosen) == 9 and len(set(chosen)) == 9
    values = [covariates[k] for k in chosen[1:]]
    assert len(set(values)) == 8  # distinct combinations first
    assert {v[0] for v in values} >= {0.0, 4.0} and {v[1] for v in values} == {0.0, 1.0, 2.0}  # both ends of each
    assert "s7" in chosen or covariates["s7"] not in values  # a combination's best-measured shape stands for it


def test_a_rule_one_shape_carries_is_not_called_resolved():
    """Eight shapes at d_h/d_model 0.3-1.0, the baseline alone at 2.75 and 0.25 nats better: the slope was
    "resolved" and put in the answer, though it was the baseline's one run against the rest."""
    from nas.stats.rules import CARRIED

    rng = np.random.default_rng(0)
    values = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.75]
    scores, covariates = {}, {}
    for i, x in enumerate(values):
        key = f"s{i}"
        loss = 3.0 + rng.normal(0, 0.01) - (0.25 if x > 2 else 0.0)  # flat among the eight: only the lone one differs
        scores[key] = ShapeScores(key, (i,), (0,), (loss,))
        covariates[key] = [x, float(i % 2)]
    fit = fit_rules(scores, covariates, ["a", "b"], 3.0)
    carried = fit.estimate("a")
    assert carried.verdict == CARRIED and carried.carried_by == "s8" and carried.estimate < 0
    assert "a" not in [e.name for e in fit.resolved]  # so no sentence of the answer states it
    spread = {**covariates, "s8": [1.1, 0.0]}  # the same shape beside the others: nothing stands alone
    assert fit_rules(scores, spread, ["a", "b"], 3.0).estimate("a").verdict != CARRIED
