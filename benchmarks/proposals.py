"""Figure 9, wasted proposals: how often the sampler proposes the baseline or an already-proposed shape.

No training: each space of the default ``cpu`` proxy is sampled the way ``nas search`` samples it
(``space.suggest`` under RandomSampler and under multivariate TPE, told a synthetic loss) for 200
proposals, three seeds each; a proposal of a shape proposed before is a duplicate (a real search
answers it from the stored result, but it is a wasted draw). Before the change that drew the
plateau count and the hourglass/conventional choice in proportion to their members, the
baseline took 25 of 100 random prism proposals and 51 of 100 hourglass ones (README).
"""

from __future__ import annotations

import statistics
import time
import warnings

from benchmarks.harness import BenchConfig, Figure


def proposal_rates(space_name: str, sampler_name: str, proposals: int, seed: int) -> tuple[float, float, int]:
    import optuna

    from benchmarks.synthetic_studies import true_loss
    from runners.presets import get_preset
    from search_spaces.factory import SpaceOptions, build_space

    space = build_space(SpaceOptions(space=space_name), defaults=get_preset("cpu").baseline)
    baseline = space.baseline()
    sampler = (optuna.samplers.RandomSampler(seed=seed) if sampler_name == "random" else
               optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, seed=seed,
                                          n_startup_trials=10))
    study = optuna.create_study(sampler=sampler)
    seen, duplicates, baselines = set(), 0, 0
    for _ in range(proposals):
        trial = study.ask()
        arch = space.suggest(trial)
        duplicates += arch.key() in seen
        baselines += arch == baseline
        seen.add(arch.key())
        study.tell(trial, true_loss(arch, baseline))
    return 100 * duplicates / proposals, 100 * baselines / proposals, space.count()


def run(cfg: BenchConfig) -> Figure:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    started = time.perf_counter()
    proposals, seeds = (30, 1) if cfg.smoke else (200, 3)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for space in ("prism", "hourglass", "joint"):
            for sampler in ("random", "tpe"):
                runs = [proposal_rates(space, sampler, proposals, cfg.seed + s) for s in range(seeds)]
                rows.append({"space": space, "members": runs[0][2], "sampler": sampler, "proposals": proposals,
                             "duplicates per 100": statistics.fmean(r[0] for r in runs),
                             "baseline per 100": statistics.fmean(r[1] for r in runs),
                             "baseline share if uniform": 100 / runs[0][2]})
    worst = max(r["baseline per 100"] / r["baseline share if uniform"] for r in rows if r["sampler"] == "random")
    return Figure(number=9, name="proposals", title="Wasted proposals: the baseline and repeated shapes",
                  target="report; the baseline about one draw in count() under random sampling",
                  method=__doc__.split("\n\n", 1)[1].split("\n\n")[0].replace("\n", " "),
                  columns=["space", "members", "sampler", "proposals", "duplicates per 100", "baseline per 100",
                           "baseline share if uniform"], rows=rows, passed=None,
                  summary=f"random sampling proposes the baseline at most {worst:.1f}x its uniform share",
                  seconds=time.perf_counter() - started, smoke=cfg.smoke)
