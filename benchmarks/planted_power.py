"""Does the search find a shape that truly is better? The answer's power at the search level, on known truths.

The answer's minimum detectable gain (``nas.stats.resolution``) is the leader's comparison's: the gain its interval
detects with 80 % power on the seeds the leader and the baseline have. It does not say whether the search would have
found a better shape and given it those seeds. This script plants one: in the known truths of
``benchmarks/ranking_simulation.py`` (``draw_truth``: true means spread with sd ``--spread``, the baseline
``--baseline-z`` spreads ahead of the pack's centre), one shape other than the baseline, drawn at random, gets the
true mean ``baseline x (1 - gain / 100)``; the real planner runs the study to its budget (``play_study``) and the
real answer (``nas.stats.answer.build_answer``) answers it. Per planted gain, over ``--studies`` studies:

- P(the answer says a shape beats the baseline), and that it is the planted one (its interval above zero);
- P(the pick is the planted shape), and the planted shape's median seeds (1: the search never replicated it);
- P(the planted shape is declared | it is the pick): the leader's comparison's own power;
- the median minimum detectable gain the answers stated;
- where the pick is the planted shape (the sentence's leader), the power its answer states for the planted gain
  (``nas.stats.resolution.posterior_power`` on the answer's own design, ``nas.stats.answer.leader_design``), averaged
  over those studies, beside the share declared: the stated power checked where it is a statement about the
  planted shape (equal when honest; the conditioning on the pick raises both).

Study ``i`` uses the seed ``seed * 100_000 + i`` (``ranking_simulation``'s convention), so the rows for different
gains share their truths but for the planted shape.

    python -m benchmarks.planted_power --gains 0,5,8 --paired-sd 0.129 --spread 0.023 --baseline-z 1.645 \\
        --studies 100 --seed 80 [--out FILE]

About 2.5 s a study on one core (2-core AMD EPYC, fp32 matmul peak ~143 GFLOP/s).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import random
import statistics
import time
from pathlib import Path

from benchmarks.ranking_simulation import (
    FIRST_PASS,
    PAIRED_SD,
    SPREAD_SD,
    Truth,
    cpu_search,
    draw_truth,
    play_study,
    simulated_evidence,
)

REPLICATE_TRIALS = 71  # what the default 200-trial search leaves after its first pass


def planted(truth: Truth, rng: random.Random, gain_pct: float) -> tuple[Truth, str]:
    """``truth`` with one shape other than the baseline (drawn by ``rng``) at ``gain_pct`` % below the baseline's
    true mean, and that shape; the truth's best is whichever is now lowest."""
    others = [k for k in truth.means if k != truth.baseline]
    key = others[rng.randrange(len(others))]
    means = {**truth.means, key: truth.means[truth.baseline] * (1 - gain_pct / 100)}
    return Truth(means, min(means, key=means.get), truth.baseline), key  # type: ignore[arg-type]


def study(args: tuple[str, float, int, float, float, float, int]) -> dict[str, float]:
    """One study with a shape planted ``gain_pct`` % better, answered by the real summary after its budget."""
    from nas.stats.answer import build_answer, leader_design
    from nas.stats.comparisons import ALPHA
    from nas.stats.resolution import posterior_power

    policy, gain_pct, seed, paired_sd, spread, baseline_z, replicate_trials = args
    search = cpu_search(policy, FIRST_PASS + replicate_trials)
    rng = random.Random(seed)
    keys = [a.key() for a in search.members()]
    truth, key = planted(draw_truth(keys, search.baseline.key(), rng, spread, baseline_z), rng, gain_pct)
    trials = play_study(search, truth.means, rng, paired_sd)
    data = simulated_evidence(trials, truth.baseline, search.train.seed)
    summary = build_answer(data)
    declared = summary.beats_baseline
    design = leader_design(data, key) if summary.best == key else None
    gain = truth.means[truth.baseline] - truth.means[key]  # nats
    stated_power = posterior_power(design, gain, ALPHA) if design is not None else math.nan
    return {"declared": float(declared), "planted_declared": float(declared and summary.best == key),
            "pick_is_planted": float(summary.best == key), "planted_seeds": float(data.scores[key].n),
            "mdg_pct": summary.resolution.gain_pct if summary.resolution is not None else math.nan,
            "stated_power": stated_power}


def row(gain_pct: float, outcomes: list[dict[str, float]]) -> dict[str, object]:
    """The summary of one planted gain's studies (module docstring)."""
    picked = [o for o in outcomes if o["pick_is_planted"]]
    stated = [o["mdg_pct"] for o in outcomes if math.isfinite(o["mdg_pct"])]
    stated_power = [o["stated_power"] for o in picked if math.isfinite(o["stated_power"])]
    return {"planted gain %": gain_pct, "studies": len(outcomes),
            "P(answer: a shape beats the baseline)": statistics.fmean(o["declared"] for o in outcomes),
            "P(answer: the planted one beats it)": statistics.fmean(o["planted_declared"] for o in outcomes),
            "P(pick = planted)": statistics.fmean(o["pick_is_planted"] for o in outcomes),
            "P(planted declared | pick = planted)":
                statistics.fmean(o["planted_declared"] for o in picked) if picked else None,
            "median seeds of the planted shape": statistics.median(o["planted_seeds"] for o in outcomes),
            "median stated MDG %": statistics.median(stated) if stated else None,
            "stated power at the planted gain | pick = planted":
                statistics.fmean(stated_power) if stated_power else None}


def measure(gains: tuple[float, ...], studies: int, processes: int, seed: int, policy: str = "adaptive",
            paired_sd: float = PAIRED_SD, spread: float = SPREAD_SD, baseline_z: float = 0.0,
            replicate_trials: int = REPLICATE_TRIALS) -> list[dict[str, object]]:
    """One row per planted gain, on ``processes`` processes."""
    rows = []
    with multiprocessing.get_context("spawn").Pool(max(1, processes)) as pool:
        for gain_pct in gains:
            outcomes = pool.map(study, [(policy, gain_pct, seed * 100_000 + i, paired_sd, spread, baseline_z,
                                         replicate_trials) for i in range(studies)])
            rows.append({**row(gain_pct, outcomes), "policy": policy, "paired sd": paired_sd, "true-mean sd": spread,
                         "baseline z": baseline_z, "replicate trials": replicate_trials})
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    from benchmarks.ranking_simulation import CHOICES

    planners = tuple(p for p in CHOICES if p != "oracle")  # the oracle is a reference, not a planner
    parser = argparse.ArgumentParser(prog="python -m benchmarks.planted_power",
                                     description="how often the search finds and declares a shape planted x % "
                                                 "better than the baseline (module docstring)")
    parser.add_argument("--gains", default="0,5,8", help="comma-separated planted gains, %% of the baseline's loss")
    parser.add_argument("--policy", default="adaptive", help="the replicates policy: " + ", ".join(planners))
    parser.add_argument("--studies", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paired-sd", type=float, default=PAIRED_SD)
    parser.add_argument("--spread", type=float, default=SPREAD_SD)
    parser.add_argument("--baseline-z", type=float, default=0.0)
    parser.add_argument("--machine", default="", help="which kind of machine ran it, for the record")
    parser.add_argument("--out", help="append the rows to this JSON")
    args = parser.parse_args(argv)
    try:
        gains = tuple(float(g) for g in args.gains.split(",") if g.strip())
    except ValueError:
        parser.error(f"--gains {args.gains!r} is not a list of numbers; give e.g. 0,5,8")
    if not gains or any(not (0 <= g < 100) for g in gains):
        parser.error(f"--gains {args.gains!r}: each gain is a share of the baseline's loss in [0, 100)")
    if args.policy not in planners:
        parser.error(f"unknown policy {args.policy!r}; choose from {', '.join(planners)}")
    if args.studies < 1:
        parser.error(f"--studies {args.studies} is too few; give 1 or more")
    for name, value in (("--paired-sd", args.paired_sd), ("--spread", args.spread)):
        if not (0 < value < 10):
            parser.error(f"{name} {value} is not a standard deviation in nats; give one in (0, 10)")
    started = time.perf_counter()
    rows = measure(gains, args.studies, args.processes, args.seed, args.policy, args.paired_sd, args.spread,
                   args.baseline_z)
    seconds = time.perf_counter() - started
    print(f"{seconds:.0f} s")
    if args.out:
        path = Path(args.out)
        stored = json.loads(path.read_text()) if path.exists() else {"what": "benchmarks/planted_power.py", "runs": []}
        stored["runs"].append({"rows": rows, "studies": args.studies, "seed": args.seed, "seconds": round(seconds),
                               "machine": args.machine, "date": time.strftime("%Y-%m-%d")})
        path.write_text(json.dumps(stored, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
