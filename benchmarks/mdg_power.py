"""Is the answer's "80 % power" honest? The stated minimum detectable gain against a simulation of the study itself.

After adaptive replicates every answer says what it could have seen: "this study would have detected a gain of
x % or more (80 % power of its 95 % credible interval ...)" (``nas.stats.resolution.posterior_resolution``). That
formula holds ``lambda = s2 / tau^2`` at the study's REML estimate; the answer refits it, and a shape truly ``x``
better would have moved it. This script measures the power the study's own test has, by simulation on the study's
own design (a parametric bootstrap at its fitted variance components)::

    L_s,i = m_s + u_i + e_s,i,   m_s ~ N(d, tau^2) (the baseline 0, the leader -delta),
                                 u_i ~ N(0, sd(u_hat)^2),  e ~ N(0, s2)

on exactly the (shape, seed) pairs the study trained, with ``tau``, ``s2``, the seed effects' sd and the pack's
centre ``d`` against the baseline (``-m_base``, the baseline a fixed effect) from its plug-in REML fit
(``nas.stats.shrinkage.fit(plug_in=True)``): the other shapes stand where the study found them, so the shrinkage's
pull of the leader towards them is in the draws (the stated gain's formula, at a fixed ``lambda``, holds the other
shapes at the baseline's level; ``benchmarks/RESULTS.md`` measures what that leaves out). Each simulated study is
judged by the answer's own test (the refitted model's robust credible interval, ``nas.stats.board.rank_shapes``):
the leader is called better when its interval's upper end of ``m_leader - m_base`` lies below zero. With common
random numbers the call is monotone in ``delta``, so each draw has a *detection threshold* ``delta_i`` (the least
gain it detects, by bisection), and::

    power(delta) = share of draws with delta_i <= delta,      simulated MDG = their 80th percentile

It reports the power at the stated gain and the simulated MDG beside it. The leader is the sentence's (the pick, or
the best other shape when the baseline is the pick: ``nas.stats.answer.sentence_leader``).

Beside them, the **split**: the minimum detectable gain the answer would state under the study's own model (its REML
``lambda`` and ``s2``, its robust widening and quantile) had the leader and the baseline shared every replicate trial
on common seeds (``1 + R // 2`` each, the allocation limit's split), every other shape on its first seed alone
(``split_resolution``). The allocation limit is a paired t-test's; the split is the same oracle read by the answer's
own test, shrinkage included. Their ratio says whether the limit is a fair yardstick for the answer's model (near 1:
the gap between the stated gain and the limit is the allocation's, not the model's).

    python -m benchmarks.mdg_power --storage sqlite:///nas.db [--study-name NAME] [--draws 200] [--out FILE]

About 0.3 s a draw on a 200-trial study (2-core AMD EPYC, fp32 matmul peak ~143 GFLOP/s).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nas.stats.scores import ShapeScores

if TYPE_CHECKING:
    from nas.stats.resolution import Resolution

POWER = 0.8
MAX_GAIN = 4.0  # nats: a draw that has not detected this much by then is given it (never seen)


@dataclass(frozen=True)
class PowerCheck:
    """The stated minimum detectable gain of a study's answer against its simulated power."""

    study: str
    leader: str
    leader_seeds: int
    baseline_seeds: int
    tau: float  # the plug-in REML spread of the shape levels (nats)
    sigma: float  # the plug-in REML run noise (nats)
    seed_sd: float  # sd of the fitted seed effects
    draws: int
    stated_gain: float  # nats (the answer's minimum detectable gain)
    stated_pct: float
    power_at_stated: float  # the simulated power at the stated gain (stated: 0.8)
    simulated_gain: float  # nats: the 80th percentile of the draws' detection thresholds
    simulated_pct: float
    thresholds_quartiles: tuple[float, float, float]  # nats
    limit_pct: float  # the allocation limit (nas.stats.resolution.allocation_limit)
    split_pct: float  # the answer's own test on the limit's split (split_resolution)
    pack: float = math.nan  # nats: the pack's centre behind the baseline, where the draws put the other shapes


def shifted(scores: dict[str, ShapeScores], key: str, shift: float) -> dict[str, ShapeScores]:
    """``scores`` with every loss of ``key`` moved by ``shift`` nats."""
    shape = scores[key]
    return {**scores, key: ShapeScores(shape.key, shape.trials, shape.seeds, tuple(v + shift for v in shape.losses))}


def detected(scores: dict[str, ShapeScores], leader: str, baseline: str) -> bool:
    """The answer's call: the upper end of the leader's robust credible interval of ``m_leader - m_base`` below 0."""
    from nas.stats.board import rank_shapes

    gain = rank_shapes(scores, baseline).gains.get(leader)
    return gain is not None and gain.high is not None and gain.high < 0


def threshold(scores: dict[str, ShapeScores], leader: str, baseline: str, tolerance: float = 1e-4) -> float:
    """The least true gain (nats) at which this draw's answer calls the leader better: its scores moved down by it.

    0 when the draw detects it already; bisection between the last undetected and the first detected gain."""
    if detected(scores, leader, baseline):
        return 0.0
    low, high = 0.0, 0.05
    while not detected(shifted(scores, leader, -high), leader, baseline):
        low, high = high, 2 * high
        if high > MAX_GAIN:
            return MAX_GAIN
    while high - low > tolerance:
        middle = (low + high) / 2
        low, high = (low, middle) if detected(shifted(scores, leader, -middle), leader, baseline) else (middle, high)
    return high


def simulated_study(scores: dict[str, ShapeScores], baseline: str, leader: str, tau: float, sigma: float,
                    seed_sd: float, rng: np.random.Generator, pack: float = 0.0) -> dict[str, ShapeScores]:
    """One draw of the module docstring's model on the study's own (shape, seed) pairs, the leader level with the
    baseline (its gain is added by ``threshold``), every other shape drawn around ``pack`` nats behind it."""
    seeds = sorted({s for shape in scores.values() for s in shape.seeds})
    effect = dict(zip(seeds, rng.normal(0.0, seed_sd, len(seeds))))
    out = {}
    for key, shape in scores.items():
        level = 0.0 if key in (baseline, leader) else pack + float(rng.normal(0.0, tau))
        noise = rng.normal(0.0, sigma, len(shape.seeds))
        out[key] = ShapeScores(key, shape.trials, shape.seeds,
                               tuple(3.0 + level + effect[s] + float(e) for s, e in zip(shape.seeds, noise)))
    return out


def split_resolution(scores: dict[str, ShapeScores], baseline: str, leader: str, replicate_trials: int,
                     tau: float, sigma: float, df: int, widening: float) -> Resolution | None:
    """The minimum detectable gain (``nas.stats.resolution.Resolution``) that the answer's test (the shrunk gain's
    robust credible interval, ``posterior_resolution``) states at the variance components ``tau``, ``sigma`` for a
    design where the leader and the baseline share ``n = 1 + replicate_trials // 2`` common seeds and every other
    shape keeps its first seed alone; ``df`` and ``widening`` are the study's (its ``s2``'s degrees of freedom and the
    leader's robust widening). None when the shrinkage keeps nothing of a gain. At a fixed ``lambda`` the interval's
    width does not read the losses, only which shape trained on which seed."""
    from dataclasses import replace

    from nas.stats.comparisons import ALPHA
    from nas.stats.resolution import gain_design, posterior_resolution
    from nas.stats.shrinkage import fit

    n = 1 + replicate_trials // 2
    first = min(s for shape in scores.values() for s in shape.seeds)
    design = {}
    for key, shape in scores.items():
        seeds = tuple(range(first, first + n)) if key in (leader, baseline) else shape.seeds[:1]
        design[key] = ShapeScores(key, tuple(range(len(seeds))), seeds, tuple(shape.mean for _ in seeds))
    gains = gain_design(design, leader, baseline, fit(design, known=(tau, sigma), baseline=baseline))
    if gains is None:
        return None
    return posterior_resolution(replace(gains, df=df, widening=widening), n, n, ALPHA, scores[baseline].mean)


def check(data, draws: int = 200, seed: int = 0) -> PowerCheck:
    """``PowerCheck`` for one study snapshot (``reports.frame.StudyData``) whose answer is a shrunk interval."""
    from nas.stats.answer import best_shape, sentence_leader, study_limit, study_resolution

    evidence = data.evidence
    if not evidence.adaptive:
        raise ValueError("its answer is not a shrunk credible interval (no adaptive replicates): its minimum "
                         "detectable gain is a paired t-test's, exact by construction")
    best = best_shape(evidence)
    res = study_resolution(evidence, best)
    model = data.model(plug_in=True)
    if res is None or model is None or not model.components:
        raise ValueError("it has no minimum detectable gain yet (nothing is shrunk)")
    baseline, leader = data.baseline_key, sentence_leader(evidence, best)
    component = max(model.components, key=lambda c: c.weight)
    sigma = math.sqrt(component.s2)
    tau = math.sqrt(component.s2 / math.exp(component.log_lam))
    seed_sd = float(np.std(component.sol.u))
    pack = -float(component.sol.m[model.keys.index(baseline)])  # d: the pack's centre behind the fixed baseline
    rng = np.random.default_rng(seed)
    found = [threshold(simulated_study(data.scores, baseline, leader, tau, sigma, seed_sd, rng, pack), leader,
                       baseline) for _ in range(draws)]
    base_loss = data.scores[baseline].mean
    simulated = float(np.quantile(found, POWER))
    quartiles = tuple(float(q) for q in np.quantile(found, [0.25, 0.5, 0.75]))
    limit = study_limit(evidence, res)
    shrunk = data.gains().get(leader)
    split = split_resolution(data.scores, baseline, leader, evidence.replicate_trials(), tau, sigma, model.df,
                             shrunk.widening if shrunk is not None else 1.0)
    return PowerCheck(data.name, leader, data.scores[leader].n, data.scores[baseline].n, tau, sigma, seed_sd, draws,
                      res.gain, res.gain_pct, float(np.mean([t <= res.gain for t in found])), simulated,
                      100 * simulated / base_loss, quartiles,  # type: ignore[arg-type]
                      limit.gain_pct if limit is not None else math.nan, split.gain_pct if split else math.nan,
                      pack)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.mdg_power",
                                     description="the answer's stated minimum detectable gain against a simulation "
                                                 "of the study's own design (module docstring)")
    parser.add_argument("--storage", required=True, help="the study's storage URL, e.g. sqlite:///nas.db")
    parser.add_argument("--study-name", default=None, help="the study (default: the storage's only shape search)")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--machine", default="", help="which kind of machine ran it, for the record")
    parser.add_argument("--out", help="append the result to this JSON (e.g. benchmarks/data/mdg_power.json)")
    args = parser.parse_args(argv)
    if args.draws < 10:
        parser.error(f"--draws {args.draws} is too few for an 80th percentile; give 10 or more")
    from nas.errors import UsageError
    from nas.study.existing import load_existing_study
    from reports.frame import read_study

    try:
        study = load_existing_study(args.storage, args.study_name)
    except UsageError as error:
        parser.error(str(error))
    started = time.perf_counter()
    try:
        result = check(read_study(study), args.draws, args.seed)
    except ValueError as error:
        parser.error(f"study {study.study_name!r}: {error}")
    seconds = time.perf_counter() - started
    print(f"{result.study}: stated minimum detectable gain {result.stated_pct:.2f} % ({result.stated_gain:.3f} "
          f"nats; leader on {result.leader_seeds} seeds, baseline on {result.baseline_seeds}); simulated power "
          f"there {result.power_at_stated:.2f} (stated {POWER:.2f}); the simulated {100 * POWER:.0f} % point "
          f"{result.simulated_pct:.2f} % ({result.simulated_gain:.3f} nats); {result.draws} draws at tau "
          f"{result.tau:.4f}, sigma {result.sigma:.4f}, seed sd {result.seed_sd:.4f}, the other shapes around "
          f"{result.pack:+.4f} nats from the baseline; the allocation limit "
          f"{result.limit_pct:.2f} %, its split read by the answer's own test {result.split_pct:.2f} % "
          f"({result.split_pct / result.limit_pct:.2f}x); {seconds:.0f} s")
    if args.out:
        path = Path(args.out)
        stored = json.loads(path.read_text()) if path.exists() else {"what": "benchmarks/mdg_power.py", "runs": []}
        stored["runs"].append({**asdict(result), "seed": args.seed, "seconds": round(seconds, 1),
                               "machine": args.machine, "date": time.strftime("%Y-%m-%d")})
        path.write_text(json.dumps(stored, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
