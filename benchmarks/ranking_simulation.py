"""Figure 10, known truth: how often the replicate policies pick the true best shape, at equal trial budgets.

No training: a simulated study of the default ``cpu`` prism space (129 schedules) gives every
shape a true mean loss and draws each (shape, seed) score as

    L(shape, s) = mu_shape + u_s + e_shape,s       u_s ~ N(0, SEED_SD^2) shared by every shape at seed s,
                                                   e   ~ N(0, PAIRED_SD^2 / 2)   (so L_a,s - L_b,s has sd PAIRED_SD)

with ``mu`` spread and noise taken from the proxy's measurements (README, "What the proxy can
resolve"). Every trial is chosen by the real planner (``nas.study.planning.plan_next``, the code a
search runs) and every study is judged by the real answer (``nas.stats.answer.build_answer``): the
pick, the tied set, and the pick's paired gain over the baseline with its interval. Policies, at
the same number of trials: ``fixed`` (seed replicates of the baseline and the 4 best by
seed-adjusted loss, ``--replicates fixed``), ``race`` (racing, ``--replicates race``) and
``adaptive`` (the knowledge gradient on the study's own shrunk posterior, ``--replicates
adaptive``, ``nas.study.adaptive``), each judged after several replicate budgets; the opt-in
``adaptive-answer`` (the knowledge gradient with the answer's sentence valued beside the pick) runs when
``--policies`` names it, not in ``nas bench``. Reported per
policy and budget, over ``studies`` simulated studies: P(the pick is the true best), P(the true
best is in the tied set), mean regret (true loss of the pick minus the best's), the coverage of
the pick's nominal 95 % interval of its gain, and the leaderboard's quality (Spearman correlation
of its order with the true means, and the regret of its rank 1) for the shrunk ranking against
the seed-adjusted one it replaced.

Two reference rows say what the target asks of any allocation, not only of ours:

- ``oracle`` is a reference, not a policy the tool could run (issue 23 called it a bound; the
  knowledge gradient, which does not know the truth, beats it at the measured noise: the bound
  holds for the allocation it runs, not for every allocation): top-two Thompson sampling (Russo,
  "Simple Bayesian algorithms for best-arm identification", 2016, with beta = 1/2) that *knows*
  the truth's prior (``N(2.90, SPREAD_SD^2)``) and every seed's shared effect ``u_s``, and picks
  the shape with the lowest posterior mean. Per shape, with ``n`` scores ``x_i - u_i`` and
  ``sigma^2 = PAIRED_SD^2 / 2``: ``precision = 1 / SPREAD_SD^2 + n / sigma^2``, ``mean =
  (2.90 / SPREAD_SD^2 + sum(x_i - u_i) / sigma^2) / precision``. It trains one shape per trial on
  that shape's next seed.
- ``quieter`` rows rerun every policy with the paired sd halved: what a proxy with half the
  noise (about four times the tokens per trial) would buy.

``--paired-sd`` and ``--spread`` measure another regime than figure 10's: a real study's own paired sd
and spread of true means (its REML ``tau``; the default search's are about 0.129 and 0.023, a space far
flatter than figure 10's 0.060), into a file of their own
(``benchmarks/data/ranking_simulation_flat.json``); its rows carry ``true-mean sd``. ``--baseline-z`` puts the
baseline's true mean that many spreads below the schedules' centre (figure 10's is at the centre, so the pick is
rarely the baseline; in the real space the baseline *is* the posterior's pick): its rows carry ``baseline z``.
"""

from __future__ import annotations

import math
import multiprocessing
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.harness import BenchConfig, Figure

# Measured on the default cpu proxy (benchmarks figure 11, the weight-average proxy, six schedules x four seeds;
# README "What the proxy can resolve"): the truth the simulation draws from
SEED_SD = 0.098  # the part of a score's seed sd that every shape shares at a seed: sqrt(0.1255^2 - 0.111^2 / 2)
PAIRED_SD = 0.111  # sd of the difference between two shapes on one common seed
SPREAD_SD = 0.060  # sd of the schedules' true mean losses
BEST_GAP = 0.015  # the true best's lead over the second best (nats): half a paper-sized 1 % effect
FIRST_PASS = 129
REPLICATE_BUDGETS = (24, 47, 71)  # trials after the first pass (71: the README's 200-trial search; 47 = 2/3 of it)
SMOKE_BUDGETS = (3, 6)  # the smoke run: every planner and judge on a few replicate trials (a knowledge-gradient
#                         trial costs tens of milliseconds: 71 of them per study made most of the whole smoke's time)
STUDIES = 1000
QUIETER = 0.5  # the quieter rows' paired sd, as a fraction of PAIRED_SD


@dataclass(frozen=True)
class Truth:
    means: dict[str, float]
    best: str
    baseline: str


def draw_truth(keys: list[str], baseline: str, rng: random.Random, spread: float = SPREAD_SD,
               baseline_z: float = 0.0) -> Truth:
    """True means: a spread of schedules (sd ``spread``) around 2.90, the baseline at ``2.90 - baseline_z spread``
    (0: mid-spread, figure 10's; 1.645: better than 95 % of the schedules, the real space's regime, where the
    baseline is the posterior's pick), the best one ``BEST_GAP`` ahead of the rest."""
    means = {key: 2.90 + rng.gauss(0.0, spread) for key in keys}
    means[baseline] = 2.90 - baseline_z * spread
    ranked = sorted(means, key=means.get)
    best = ranked[0]
    means[best] = min(means[best], means[ranked[1]] - BEST_GAP)
    return Truth(means, best, baseline)


def cpu_search(policy: str, trials: int, race_size: int = 8):
    """A ``nas.study.session.Search`` of the default ``cpu`` prism space with replicates ``policy`` and a budget of
    ``trials``, without storage: what the simulated studies plan with."""
    from nas.study.config import SearchConfig
    from nas.study.session import Search
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space

    preset = get_preset("cpu")
    space = build_space(SpaceOptions(space="prism"), defaults=preset.baseline)
    config = SearchConfig(trials=trials, replicates=policy, race_size=race_size)
    return Search(config, None, space, preset.train, None, True, None, 0)  # type: ignore[arg-type]


def play_study(search, means: dict[str, float], rng: random.Random, paired_sd: float = PAIRED_SD) -> list:
    """The study's trials to its budget, each planned by the real planner (``nas.study.planning.plan_next``) and
    scored ``means[shape] + u_seed + e`` (module docstring), the seed effects and the noise drawn from ``rng``."""
    import optuna

    from nas.study.planning import plan_next
    from nas.study.records import counts, shape_attrs

    archs = {a.key(): a for a in search.members()}
    seed_effects: dict[int, float] = {}
    trials: list = []
    while sum(counts(t) for t in trials) < search.config.trials:
        plan = plan_next(search, trials)
        key, s, role = plan.user_attrs["key"], plan.user_attrs["seed"], plan.user_attrs["role"]
        u = seed_effects.setdefault(s, rng.gauss(0.0, SEED_SD))
        loss = means[key] + u + rng.gauss(0.0, paired_sd / math.sqrt(2))
        trial = optuna.trial.create_trial(value=loss, user_attrs={**shape_attrs(archs[key], s, role),
                                                                  "val_loss": loss})
        trial.number = len(trials)
        trials.append(trial)
    return trials


def simulate_study(policy: str, budgets: tuple[int, ...], seed: int, race_size: int = 8,
                   paired_sd: float = PAIRED_SD, spread: float = SPREAD_SD,
                   baseline_z: float = 0.0) -> list[dict[str, float]]:
    """One simulated study run to ``max(budgets)`` replicate trials, judged after each budget's trials (true means
    spread with sd ``spread``, the baseline at ``baseline_z``: ``draw_truth``).

    Every policy's planner is *anytime* (no choice reads the study's trial budget), so the study's first
    ``FIRST_PASS + b`` trials are exactly the study it would have run with ``b`` replicate trials: the budgets'
    rows share their studies (a paired comparison across budgets) at a third of the cost."""
    search = cpu_search(policy, FIRST_PASS + max(budgets), race_size)
    rng = random.Random(seed)
    keys = [a.key() for a in search.members()]
    truth = draw_truth(keys, search.baseline.key(), rng, spread, baseline_z)
    trials = play_study(search, truth.means, rng, paired_sd)
    return [judge(trials[:FIRST_PASS + b], truth, search.train.seed, paired_sd, spread) for b in budgets]


def simulated_attrs(baseline: str, base_seed: int) -> dict:
    """The study attributes a reader needs of a simulated study: its baseline and base seed."""
    return {"nas:baseline_key": baseline, "nas:identity": {"train": {"seed": base_seed}}}


def simulated_evidence(trials: list, baseline: str, base_seed: int):
    """A simulated study's ``nas.stats.evidence.Evidence``: what its answer is built from (no frame, no board)."""
    from reports.frame import evidence_of

    return evidence_of(trials, simulated_attrs(baseline, base_seed))


def judge(trials: list, truth: Truth, base_seed: int, paired_sd: float = PAIRED_SD,
          spread: float = SPREAD_SD) -> dict[str, float]:
    """The real answer's verdict on a simulated study (``nas.stats.answer.build_answer``) against its truth."""
    from nas.stats.answer import build_answer
    from nas.stats.comparisons import paired_gain, pooled_paired_sd

    data = simulated_evidence(trials, truth.baseline, base_seed)
    summary = build_answer(data)
    pick = summary.best
    true_gain = 100 * (truth.means[truth.baseline] - truth.means[pick]) / truth.means[truth.baseline]
    gain = summary.gain
    covered = (gain is not None and gain.low_pct is not None and gain.low_pct <= true_gain <= gain.high_pct)
    # the interval as it was before the race: every seed of the pick, the selecting one included, level 95 %
    naive = (paired_gain(data.scores[pick], data.scores[truth.baseline], set(),
                         pooled_paired_sd(data.scores, truth.baseline))
             if pick != truth.baseline else None)
    naive_covered = naive is not None and naive.low_pct is not None and naive.low_pct <= true_gain <= naive.high_pct
    board = board_quality(data.scores, truth)
    res, limit = summary.resolution, summary.limit
    return {**board, "correct": float(pick == truth.best), "in_tied": float(truth.best in summary.tied),
            "mdg_pct": res.gain_pct if res is not None else math.nan,
            "limit_pct": limit.gain_pct if limit is not None else math.nan,
            "covered_true_components": covered_with_truth(data.scores, pick, truth, paired_sd, spread)
            if gain is not None and gain.posterior and gain.low_pct is not None else math.nan,
            "regret": truth.means[pick] - truth.means[truth.best], "covered": float(covered),
            "naive_covered": float(naive_covered),
            "has_interval": float(gain is not None and gain.low_pct is not None),
            "tied_size": float(len(summary.tied)), "pick_is_baseline": float(pick == truth.baseline)}


def covered_with_truth(scores: dict, pick: str, truth: Truth, paired_sd: float, spread: float = SPREAD_SD) -> float:
    """Whether the pick's 95 % credible interval covers its true gain when the variance components are the truth's
    (tau = spread, sigma = paired_sd / sqrt 2) instead of the study's estimate: the coverage diagnosis of issue 36
    (estimation of the components against selection of the pick)."""
    from nas.stats.board import shrunk_gains

    gains, _ = shrunk_gains(scores, truth.baseline, known=(spread, paired_sd / math.sqrt(2)))
    gain = gains.get(pick)
    if gain is None or gain.low is None or pick == truth.baseline:
        return math.nan
    true = truth.means[pick] - truth.means[truth.baseline]
    return float(gain.low <= true <= gain.high)


def board_quality(scores: dict, truth: Truth) -> dict[str, float]:
    """The leaderboard's ranking against the truth, for the shrunk ranking (``nas.stats.shrinkage``, today's) and the
    seed-adjusted one (before): Spearman correlation of each shape's ranked loss with its true mean, and the regret
    of the board's rank 1."""
    from scipy import stats

    from nas.stats.board import rank_shapes
    from nas.stats.scores import seed_adjusted_means

    out = {}
    keys = list(scores)
    true = [truth.means[k] for k in keys]
    best = truth.means[truth.best]
    board = rank_shapes(scores, truth.baseline, intervals=False)
    adjusted = seed_adjusted_means(scores, truth.baseline)
    by_adjusted = sorted(keys, key=lambda k: (adjusted[k], scores[k].mean))
    for name, order in (("shrunk", board.order), ("adjusted", by_adjusted)):  # board positions: ties keep an order
        position = {k: i for i, k in enumerate(order)}
        out[f"board_rho_{name}"] = float(stats.spearmanr([position[k] for k in keys], true).statistic)
        out[f"board_regret_{name}"] = truth.means[order[0]] - best
    return out


def simulate_oracle(budgets: tuple[int, ...], seed: int, paired_sd: float = PAIRED_SD,
                    spread: float = SPREAD_SD, baseline_z: float = 0.0) -> list[dict[str, float]]:
    """The ``oracle`` reference (module docstring): top-two Thompson sampling knowing the prior and the seed effects."""
    rng = random.Random(seed)
    keys = [f"s{i}" for i in range(FIRST_PASS)]
    truth = draw_truth(keys, keys[0], rng, spread, baseline_z)
    prior_precision, noise_var = 1 / spread**2, paired_sd**2 / 2
    sums = dict.fromkeys(keys, 0.0)  # sum of (score - its seed's shared effect)
    n = dict.fromkeys(keys, 0)

    def train(key: str) -> None:  # the shared seed effect is known to the oracle, so it cancels exactly
        sums[key] += truth.means[key] + rng.gauss(0.0, math.sqrt(noise_var))
        n[key] += 1

    def posterior() -> dict[str, tuple[float, float]]:  # key -> (mean, sd)
        out = {}
        for key in keys:
            precision = prior_precision + n[key] / noise_var
            out[key] = ((2.90 * prior_precision + sums[key] / noise_var) / precision, math.sqrt(1 / precision))
        return out

    def sampled_best(post: dict[str, tuple[float, float]]) -> str:
        return min(keys, key=lambda key: rng.gauss(*post[key]))

    def verdict() -> dict[str, float]:
        post = posterior()
        pick = min(keys, key=lambda key: post[key][0])
        return {"correct": float(pick == truth.best), "regret": truth.means[pick] - truth.means[truth.best]}

    out = []
    for key in keys:  # the first pass: every shape once
        train(key)
    for done in range(max(budgets) + 1):
        if done in budgets:
            out.append(verdict())
        if done == max(budgets):
            break
        post = posterior()
        leader = sampled_best(post)
        choice = leader
        if rng.random() < 0.5:  # the challenger: resample until another shape comes out best
            for _ in range(100):
                choice = sampled_best(post)
                if choice != leader:
                    break
        train(choice)
    return out


def _one(args: tuple[str, tuple[int, ...], int, float, float, float]) -> list[dict[str, float]]:
    policy, budgets, seed, paired_sd, spread, baseline_z = args
    if policy == "oracle":
        return simulate_oracle(budgets, seed, paired_sd, spread, baseline_z)
    return simulate_study(policy, budgets, seed, paired_sd=paired_sd, spread=spread, baseline_z=baseline_z)


def finite(outcomes: list[dict[str, float]], name: str) -> list[float]:
    """The outcomes' finite values of ``name`` (a study without a minimum detectable gain stores NaN)."""
    return [o[name] for o in outcomes if math.isfinite(o.get(name, math.nan))]


def _row(policy: str, budget: int, noise: str, outcomes: list[dict[str, float]]) -> dict[str, object]:
    """One table row: the means over ``outcomes``; an oracle row has no tied set and no interval."""
    mean = {k: statistics.fmean(o[k] for o in outcomes) for k in outcomes[0]}
    row: dict[str, object] = {"policy": policy, "noise": noise, "replicate trials": budget,
                              "studies": len(outcomes), "P(pick = true best)": mean["correct"],
                              "mean regret (nats)": mean["regret"]}
    if policy == "oracle":
        return row
    with_interval = [o for o in outcomes if o["has_interval"]]
    mdg, limit, true_cover = (finite(outcomes, name) for name in ("mdg_pct", "limit_pct", "covered_true_components"))
    ratio = [o["mdg_pct"] / o["limit_pct"] for o in outcomes if math.isfinite(o["mdg_pct"])
             and math.isfinite(o["limit_pct"]) and o["limit_pct"] > 0]
    row.update({"median MDG %": statistics.median(mdg) if mdg else None,
                "median allocation limit %": statistics.median(limit) if limit else None,
                "median MDG / limit": statistics.median(ratio) if ratio else None,
                "MDG / limit, quartiles": " / ".join(f"{q:.2f}" for q in statistics.quantiles(ratio, n=4))
                if len(ratio) >= 2 else None,
                f"share of studies with MDG within {MDG_RATIO_TARGET}x the limit":
                    sum(r <= MDG_RATIO_TARGET for r in ratio) / len(ratio) if ratio else None,
                "coverage, true variance components": statistics.fmean(true_cover) if true_cover else None,
                "P(true best in tied set)": mean["in_tied"], "mean tied-set size": mean["tied_size"],
                "interval coverage (nominal 95 %)":
                    statistics.fmean(o["covered"] for o in with_interval) if with_interval else None,
                "coverage with the selecting seed (before)":
                    statistics.fmean(o["naive_covered"] for o in with_interval) if with_interval else None,
                "studies with an interval": len(with_interval) / len(outcomes),
                "board: Spearman with truth, shrunk (seed-adjusted)":
                    f"{mean['board_rho_shrunk']:.3f} ({mean['board_rho_adjusted']:.3f})",
                "board: rank-1 regret, shrunk (seed-adjusted)":
                    f"{mean['board_regret_shrunk']:.4f} ({mean['board_regret_adjusted']:.4f})"})
    return row


PICK_ONLY = "adaptive-pick"  # the knowledge gradient for the pick alone (the default before the baseline kept pace)
POLICIES = ("fixed", "race", PICK_ONLY, "adaptive", "oracle")
# opt-in (nas.study.adaptive.answer_value): run with --policies, not by nas bench. The name of
# nas.study.planning.ANSWER, spelled here as PICK_ONLY is: importing the planner loads optuna (1.5 s) at import
ANSWER = "adaptive-answer"
CHOICES = (*POLICIES, ANSWER)
NOISES = (("measured", PAIRED_SD), (f"paired sd x{QUIETER}", PAIRED_SD * QUIETER))
DATA_FILE = "benchmarks/data/ranking_simulation.json"
MDG_RATIO_TARGET = 1.7  # the answer's minimum detectable gain within this factor of the allocation limit


def measure(policies: tuple[str, ...], studies: int, processes: int, seed: int,
            budgets: tuple[int, ...] = REPLICATE_BUDGETS, done: list[dict[str, object]] | None = None,
            on_rows: Callable[[list[dict[str, object]]], None] | None = None,
            noises: tuple[tuple[str, float], ...] = NOISES, spread: float = SPREAD_SD,
            baseline_z: float = 0.0) -> list[dict[str, object]]:
    """Every policy's rows at both noise levels and every budget; study ``i`` draws the same truth and noise for
    every policy (``seed * 100_000 + i``), so the policies are compared on the same studies.

    ``done``: rows already measured (same studies and seed); a (noise, policy) whose rows are all there is not
    measured again. ``on_rows`` gets every row so far after each (noise, policy), so a cut-off run keeps them.
    ``noises``: the (name, paired sd) levels to measure (both of ``NOISES`` by default); ``spread``: the sd of the
    true means (rows measured at another than ``SPREAD_SD`` say so in ``true-mean sd``); ``baseline_z``: where the
    baseline's true mean lies (``draw_truth``; rows measured away from 0 say so in ``baseline z``)."""
    rows = list(done or [])
    have = {(r["noise"], r["policy"]) for r in rows}
    with multiprocessing.get_context("spawn").Pool(max(1, processes)) as pool:
        for noise, paired_sd in noises:
            for policy in policies:
                if (noise, policy) in have:
                    continue
                outcomes = pool.map(_one, [(policy, budgets, seed * 100_000 + i, paired_sd, spread, baseline_z)
                                           for i in range(studies)])
                new = [_row(policy, budget, noise, [o[j] for o in outcomes]) for j, budget in enumerate(budgets)]
                new = [{**row, "true-mean sd": spread} if spread != SPREAD_SD else row for row in new]
                rows += [{**row, "baseline z": baseline_z} if baseline_z else row for row in new]
                if on_rows is not None:
                    on_rows(rows)
    order = {p: i for i, p in enumerate(CHOICES)}
    noises = {n: i for i, (n, _) in enumerate(NOISES)}
    return sorted(rows, key=lambda r: (noises.get(r["noise"], 9), order.get(r["policy"], 9), r["replicate trials"]))


def within_sampling_error(p: float, reference: float, studies: int) -> bool:
    """``p`` is not below ``reference`` by more than 1.96 standard errors of their difference (two proportions of
    ``studies`` each, taken as independent: the studies are shared, so this errs on the lenient side)."""
    se = math.sqrt((p * (1 - p) + reference * (1 - reference)) / max(1, studies))
    return p >= reference - 1.96 * se


def target_misses(rows: list[dict[str, object]]) -> list[str]:
    """Issue 36's targets for the adaptive rows (the baseline keeps pace with the pick), each miss as text (empty:
    every target met): at every noise and budget P(pick = true best) not below the pick-only allocation's beyond
    sampling error; the pick's interval covering >= 95 %; the true best in the tied set >= 90 %; the median
    minimum detectable gain within ``MDG_RATIO_TARGET`` of the allocation limit."""
    by = {(r["policy"], r["noise"], r["replicate trials"]): r for r in rows}
    misses = []
    for (policy, noise, budget), row in by.items():
        if policy != "adaptive":
            continue
        p = float(row["P(pick = true best)"])  # type: ignore[arg-type]
        where = f"{noise}, {budget} trials"
        before = by.get((PICK_ONLY, noise, budget))
        if before is not None and not within_sampling_error(p, float(before["P(pick = true best)"]),  # type: ignore
                                                            int(row["studies"])):  # type: ignore[arg-type]
            misses.append(f"P(correct) {p:.3f} below the pick-only allocation's "
                          f"{before['P(pick = true best)']:.3f} beyond sampling error ({where})")
        if float(row["P(true best in tied set)"]) < 0.90:  # type: ignore[arg-type]
            misses.append(f"true best in the tied set {row['P(true best in tied set)']:.3f} < 0.90 ({where})")
        coverage = row["interval coverage (nominal 95 %)"]
        if coverage is None or float(coverage) < 0.95:  # type: ignore[arg-type]
            misses.append(f"coverage {coverage if coverage is None else f'{coverage:.3f}'} < 0.95 ({where})")
        ratio = row.get("median MDG / limit")
        if ratio is not None and float(ratio) > MDG_RATIO_TARGET:  # type: ignore[arg-type]
            misses.append(f"median MDG {float(ratio):.2f}x the allocation limit > {MDG_RATIO_TARGET} ({where})")
    return misses


def run(cfg: BenchConfig) -> Figure:
    started = time.perf_counter()
    studies = 1 if cfg.smoke else STUDIES
    budgets = SMOKE_BUDGETS if cfg.smoke else REPLICATE_BUDGETS
    rows = measure(POLICIES, studies, cfg.threads, cfg.seed, budgets)
    misses = target_misses(rows)
    by = {(r["policy"], r["noise"], r["replicate trials"]): r for r in rows}
    full = max(budgets)
    summary = "; ".join(f"{noise}, {full} trials: " + ", ".join(
        f"{policy} {by[(policy, noise, full)]['P(pick = true best)']:.3f}" for policy in POLICIES)
        for noise, _ in NOISES)
    return Figure(
        number=10, name="ranking_simulation",
        title="Known truth: picking the best shape and answering against the baseline: fixed replicates, racing, "
              "adaptive (knowledge gradient, the baseline in pace with the pick) and the pick-only allocation",
        target="adaptive: P(pick = true best) not below the pick-only allocation's beyond sampling error at every "
               "noise and budget; the pick's 95 % interval covers >= 95 %; the true best in the tied set >= 90 %; "
               f"median minimum detectable gain within {MDG_RATIO_TARGET}x of the allocation limit",
        method=(f"{studies} simulated studies per policy and noise, judged after "
                f"{', '.join(map(str, budgets[:-1]))} and {budgets[-1]} replicate trials (the "
                f"planners are anytime: one study, {len(budgets)} prefixes): the cpu prism space (129 schedules), "
                f"true means sd {SPREAD_SD}, the best {BEST_GAP} ahead; scores = mean + shared seed effect "
                f"(sd {SEED_SD}) + paired noise (difference sd {PAIRED_SD}, and x{QUIETER} in the quieter rows); "
                "trials planned by nas.study.planning.plan_next, studies judged by nas.stats.answer.build_answer; "
                "oracle: top-two Thompson "
                "sampling that knows the prior and the seed effects (a reference, not a policy)"),
        columns=["policy", "noise", "replicate trials", "studies", "P(pick = true best)", "P(true best in tied set)",
                 "mean regret (nats)", "mean tied-set size", "interval coverage (nominal 95 %)",
                 "coverage, true variance components", "median MDG %", "median allocation limit %",
                 "median MDG / limit", "MDG / limit, quartiles",
                 f"share of studies with MDG within {MDG_RATIO_TARGET}x the limit",
                 "coverage with the selecting seed (before)", "studies with an interval",
                 "board: Spearman with truth, shrunk (seed-adjusted)", "board: rank-1 regret, shrunk (seed-adjusted)"],
        rows=rows, passed=not misses,
        summary=f"P(pick = true best) at {summary}" + (f"; missed: {'; '.join(misses)}" if misses else
                                                       "; every adaptive target met"),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.ranking_simulation",
                                     description="figure 10's rows for some policies, merged into the recorded "
                                                 "data (the whole figure: nas bench --only 10)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: " + ", ".join(CHOICES))
    parser.add_argument("--studies", type=int, default=STUDIES)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noises", default="measured,half",
                        help=f"comma-separated noise levels: measured (the proxy's paired sd), half (x{QUIETER})")
    parser.add_argument("--paired-sd", type=float, default=None,
                        help="one noise level of this paired sd instead of --noises (a study's own, e.g. 0.129)")
    parser.add_argument("--spread", type=float, default=SPREAD_SD,
                        help=f"sd of the true means (default {SPREAD_SD}, figure 10's; a flat space's is smaller)")
    parser.add_argument("--baseline-z", type=float, default=0.0,
                        help="the baseline's true mean this many spreads below the schedules' centre (default 0, "
                             "figure 10's; 1.645: better than 95 %% of them, as in the real space)")
    parser.add_argument("--machine", default="", help="which kind of machine ran it, for the record")
    parser.add_argument("--out", help=f"merge the rows into this JSON ({DATA_FILE})")
    args = parser.parse_args()
    chosen = tuple(p for p in args.policies.split(",") if p)
    unknown = [p for p in chosen if p not in CHOICES]
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r}; choose from {', '.join(CHOICES)}")
    levels = dict(zip(("measured", "half"), NOISES))
    noise_names = [n for n in args.noises.split(",") if n]
    if not noise_names or any(n not in levels for n in noise_names):
        parser.error(f"unknown noise level in {args.noises!r}; choose from measured, half")
    noises = tuple(levels[n] for n in noise_names)
    for name, value in (("--paired-sd", args.paired_sd), ("--spread", args.spread)):
        if value is not None and not (0 < value < 10):
            parser.error(f"{name} {value} is not a standard deviation in nats; give one in (0, 10)")
    if not (math.isfinite(args.baseline_z) and abs(args.baseline_z) <= 5):
        parser.error(f"--baseline-z {args.baseline_z} is not a place in the spread; give one in [-5, 5]")
    if args.paired_sd is not None:
        noise_names, noises = [f"paired sd {args.paired_sd:g}"], ((f"paired sd {args.paired_sd:g}", args.paired_sd),)
    measured_here = {name for name, _ in noises}
    path = Path(args.out) if args.out else None
    stored = json.loads(path.read_text()) if path is not None and path.exists() else {"rows": []}
    key = [list(chosen), args.studies, args.seed] + ([noise_names] if noise_names != ["measured", "half"] else []) \
        + ([args.spread] if args.spread != SPREAD_SD else []) \
        + ([["baseline z", args.baseline_z]] if args.baseline_z else [])  # named: a bare number reads as a spread
    resumed = stored.get("partial") if stored.get("partial", {}).get("key") == key else None
    started = time.perf_counter()

    def save(rows: list[dict[str, object]], finished: bool = False) -> None:
        """Every row so far into ``--out`` (the policies not re-run keep their stored rows): a cut-off run keeps
        what it had, and the same command resumes from it."""
        if path is None:
            return
        keep = [r for r in stored["rows"] if r["policy"] not in chosen or r["noise"] not in measured_here
                or r.get("true-mean sd", SPREAD_SD) != args.spread or r.get("baseline z", 0.0) != args.baseline_z]
        record = {"policies": list(chosen), "noises": noise_names, "true-mean sd": args.spread,
                  **({"baseline z": args.baseline_z} if args.baseline_z else {}),
                  "studies": args.studies, "seed": args.seed,
                  "seconds": round(time.perf_counter() - started + (resumed or {}).get("seconds", 0)),
                  "machine": args.machine, "date": time.strftime("%Y-%m-%d")}
        out = {"what": "benchmarks figure 10 (benchmarks/ranking_simulation.py)", "runs": stored.get("runs", []),
               "rows": keep + rows}
        if finished:
            out["runs"] = out["runs"] + [record]
        else:
            out["partial"] = {"key": key, "rows": rows,
                              "seconds": record["seconds"]}
        path.write_text(json.dumps(out, indent=1) + "\n")

    new_rows = measure(chosen, args.studies, args.processes, args.seed,
                       done=(resumed or {}).get("rows"), on_rows=save, noises=noises, spread=args.spread,
                       baseline_z=args.baseline_z)
    save(new_rows, finished=True)
    seconds = time.perf_counter() - started
    for row in new_rows:
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    print(f"{seconds:.0f} s; misses: {target_misses(new_rows) or 'none'}")
