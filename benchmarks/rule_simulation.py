"""Known truth for the design rules: do the rule model's intervals cover, and how often does it declare a null rule?

    python -m benchmarks.rule_simulation                       # 1,000 studies a row; writes RULE_SIMULATION_FILE
    python -m benchmarks.rule_simulation --studies 50 --rows 200:0.039 --out /tmp/rules.json
    python -m benchmarks.rule_simulation --rows 100:0.039 --out /tmp/r100.json   # ~2 h on 2 cores (below)

No training. Every shape of the default ``cpu`` Prism space (129 schedules) gets a true mean loss from planted rules
and a deviation of its own, and every run of it a seed effect and its own noise::

    mu_s = 2.90 + x_s' beta + m_s,    m_s ~ N(0, tau^2);    L_s,i = mu_s + u_i + e_s,i,    e ~ N(0, sigma^2)

at the variance components measured on the default proxy (the README's main job, 200 runs over 129 shapes, read by
the rule model: ``tau`` 0.039, ``sigma`` 0.085; the reference panel's own fit puts ``tau`` at its boundary, 0, which
the ``tau = 0`` rows draw), with ``log2_first_heads`` planted at the main job's size (``BETA``, -0.031 nats per
doubling; the issue's figure) and ``reduced_layers`` at 0 (a null rule). Each study is drawn as the real search draws
it: below the space's size (50, 75 trials) the study's own sampler proposes (a fresh TPE a trial, seeded as
``nas.study.trial.proposal_sampler`` seeds it; a shape drawn again is answered from its score and not counted), at
200 trials the exhaustive walk and the default adaptive replicates of the real planner
(``nas.study.planning.plan_next``; ``benchmarks.ranking_simulation.play_study``). Pruning is left out (a pruned
trial gives no score). Each study is then read by the real rule model (``nas.stats.rules.fit_rules``) and, at 200
trials, by the real answer (``nas.stats.answer.build_answer``).

A study below the space's size costs what its sampler's asks cost: TPE answers duplicates from their scores, so a
study of 100 distinct shapes out of 129 asks about 1,100 times (1.1 s a study at 50 trials, about 13 s at 100, on
one core of a 2-core Intel Xeon); the default rows stop at 75.

Per row: ``coverage`` of each rule's 95 % interval (target >= 0.95), the ``false rule rate`` of the null rule (the
share of studies that call it resolved; target <= 0.05), the ``power`` against the planted rule (resolved with its
sign) beside the mean MDE the studies state, and at 200 trials the shape answer's interval coverage of the pick's
true gain.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.ranking_simulation import SEED_SD, cpu_search, play_study, simulated_evidence

RULE_SIMULATION_FILE = Path(__file__).parent / "data" / "rule_simulation.json"
TAU, SIGMA = 0.039, 0.085  # the main job's shape sd beyond its rules and its run sd (nas rules on its study)
ROWS = ((50, TAU), (200, TAU), (75, TAU), (200, 0.0))  # (trials, tau): three sizes, then the boundary
BETA = {"reduced_layers": 0.0, "log2_first_heads": -0.031}  # nats per unit; the first is the null rule
BASE = 2.90
STUDIES = 1000
FIRST_PASS = 129


def covariates_of(search) -> dict[str, tuple[float, ...]]:
    from search_spaces.prism import PRISM_RULES

    rules = {rule.name: rule for rule in PRISM_RULES}
    baseline = search.baseline
    return {a.key(): tuple(rules[name].value(a, baseline) for name in BETA) for a in search.members()}


def draw_means(covariates: dict[str, tuple[float, ...]], tau: float, rng: random.Random) -> dict[str, float]:
    beta = tuple(BETA.values())
    return {key: BASE + sum(b * v for b, v in zip(beta, x)) + rng.gauss(0.0, tau) for key, x in covariates.items()}


def sampled_scores(search, means: dict[str, float], rng: random.Random) -> dict[str, Any]:
    """A study below the space's size: the study's sampler proposes (module docstring), one seed (the base)."""
    import optuna

    from nas.stats.scores import ShapeScores
    from nas.study.trial import proposal_sampler

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.enqueue_trial(search.space.params_of(search.baseline))
    u = rng.gauss(0.0, SEED_SD)  # the base seed's effect, shared by every run
    scores: dict[str, ShapeScores] = {}
    streak = 0
    while len(scores) < search.config.trials:
        trial = study.ask()
        own, study.sampler = study.sampler, proposal_sampler(search, trial.number, None, streak)
        arch = search.space.suggest(trial)
        study.sampler = own
        key = arch.key()
        if key in scores:
            streak += 1
            study.tell(trial, scores[key].losses[0])
            continue
        streak = 0
        loss = means[key] + u + rng.gauss(0.0, SIGMA)
        scores[key] = ShapeScores(key, (trial.number,), (search.train.seed,), (loss,))
        study.tell(trial, loss)
    return scores


def one_study(args: tuple[int, float, int]) -> dict[str, float]:
    """One simulated study (module docstring) and what its rules (and, at 200 trials, its answer) say."""
    import warnings

    import optuna

    from nas.stats.answer import build_answer
    from nas.stats.rules import RESOLVED, fit_rules
    from nas.study.optuna_internals import vectorise_tpe_log_ndtr

    size, tau, seed = args
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    vectorise_tpe_log_ndtr()  # the same proposals, some ten times faster (nas.study.optuna_internals)
    rng = random.Random(seed)
    search = cpu_search("adaptive", size)
    covariates = covariates_of(search)
    means = draw_means(covariates, tau, rng)
    baseline = search.baseline.key()
    out: dict[str, float] = {}
    if size >= FIRST_PASS:  # the walk and the default adaptive replicates
        trials = play_study(search, means, rng, SIGMA * math.sqrt(2))
        evidence = simulated_evidence(trials, baseline, search.train.seed)
        scores = evidence.scores
        answer = build_answer(evidence)
        gain = answer.gain
        if answer.best is not None and answer.best != baseline and gain is not None and gain.low_pct is not None:
            true = 100 * (means[baseline] - means[answer.best]) / means[baseline]
            out["shape_covered"] = float(gain.low_pct <= true <= gain.high_pct)
    else:
        scores = sampled_scores(search, means, rng)
    fit = fit_rules(scores, covariates, tuple(BETA), scores[baseline].mean if baseline in scores else None)
    if fit is None:
        return out
    for name, beta in BETA.items():
        e = fit.estimate(name)
        if e.estimate is None:
            continue
        out[f"{name}:covered"] = float(e.low <= beta <= e.high)
        out[f"{name}:resolved"] = float(e.verdict == RESOLVED)
        out[f"{name}:right_sign"] = float(e.verdict == RESOLVED and (e.estimate < 0) == (beta < 0) and beta != 0)
        out[f"{name}:mdg"] = e.mdg
        out[f"{name}:estimate"] = e.estimate
    out["shapes"], out["runs"] = fit.shapes, fit.runs
    return out


def mean_of(outcomes: list[dict[str, float]], name: str) -> float | None:
    values = [o[name] for o in outcomes if name in o]
    return statistics.fmean(values) if values else None


def row(size: int, tau: float, outcomes: list[dict[str, float]], seconds: float) -> dict[str, Any]:
    null, planted = (name for name in BETA)
    shape = [o["shape_covered"] for o in outcomes if "shape_covered" in o]
    return {"trials": size, "tau": tau, "sigma": SIGMA, "studies": len(outcomes),
            "mean shapes": mean_of(outcomes, "shapes"), "mean runs": mean_of(outcomes, "runs"),
            f"coverage {null} (null)": mean_of(outcomes, f"{null}:covered"),
            f"coverage {planted} (planted {BETA[planted]:+.3f})": mean_of(outcomes, f"{planted}:covered"),
            "false rule rate": mean_of(outcomes, f"{null}:resolved"),
            f"power {planted}": mean_of(outcomes, f"{planted}:right_sign"),
            f"mean MDE {planted} (nats/unit)": mean_of(outcomes, f"{planted}:mdg"),
            f"mean estimate {planted}": mean_of(outcomes, f"{planted}:estimate"),
            "shape answer: studies with an interval": len(shape),
            "shape answer: coverage": statistics.fmean(shape) if shape else None,
            "seconds": round(seconds, 1)}


def run_rows(studies: int, plan: tuple[tuple[int, float], ...], processes: int, seed: int,
             on_row: Any = None) -> list[dict[str, Any]]:
    rows = []
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for size, tau in plan:
            started = time.perf_counter()
            jobs = [(size, tau, seed * 1_000_003 + size * 10_007 + i + (0 if tau else 500_009)) for i in range(studies)]
            outcomes = list(pool.imap_unordered(one_study, jobs, chunksize=4))
            rows.append(row(size, tau, outcomes, time.perf_counter() - started))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rule_simulation", description=__doc__.split("\n")[0])
    parser.add_argument("--studies", type=int, default=STUDIES)
    parser.add_argument("--rows", default=",".join(f"{n}:{t:g}" for n, t in ROWS),
                        help="the rows: trials:tau pairs, comma-separated (tau: the shapes' sd beyond their rules)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RULE_SIMULATION_FILE)
    args = parser.parse_args(argv)
    plan = tuple((int(n), float(t)) for n, t in (item.split(":") for item in args.rows.split(",")))
    from benchmarks.harness import machine_info

    header = {"what": "benchmarks/rule_simulation.py: planted design rules on the default cpu Prism space",
              "beta": BETA, "sigma": SIGMA, "seed": args.seed, "machine": machine_info(1, "cpu")}

    def save(rows: list[dict[str, Any]]) -> None:
        args.out.write_text(json.dumps({**header, "rows": rows}, indent=1) + "\n")

    run_rows(args.studies, plan, args.processes, args.seed, on_row=save)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
