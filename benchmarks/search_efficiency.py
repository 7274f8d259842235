"""Figure 6, search efficiency: training tokens TPE + pruning + de-duplication spend to find the best shape.

Method (a replay, so that every strategy faces the same, fully known losses):

1. *Table.* Every member of the tiny preset's hourglass space (baseline L4 d32 h4, default grid
   K x L x d_h/d_model, budget-matched within 1 %: 34 shapes) is trained with ``runners.proxy.run``
   on the builtin data with two seeds; each run's evaluation curve (tokens seen, validation
   loss) is stored. An hourglass space is used because its members differ by more than seed
   noise in a short run, so "the best shape" is well defined (the head schedules of a prism
   space this small are all within seed noise of each other at this budget).
2. *Targets.* The best shape has the lowest mean loss over the two seeds. A seed shifts every
   shape's loss together (it fixes the data order), so the noise that matters for a ranking is
   the shape x seed interaction: ``s^2 = sum_shapes ((l0 - l1) - (m0 - m1))^2 / 2 / (n - 1)`` with
   ``m0, m1`` the seeds' means over shapes. Every shape whose mean is within ``1.96 s`` of the
   best's (not distinguishable from it with two seeds each) is a target.
3. *Replay.* A search is an Optuna study whose objective looks the shape up in the table: it
   reports the stored evaluation curve of one seed (the "world": seed 0 for even sampler seeds,
   1 for odd) point by point through ``trial.report`` / ``trial.should_prune``, so pruning
   decisions are Optuna's own, and a pruned trial has spent only the tokens up to that point.
   As in ``nas search``: the baseline is trial 0, TPE and the median pruner are built by
   ``nas.study.make_sampler`` / ``make_pruner``, a shape already trained is answered from the
   study at no token cost (de-duplication), and after 10 duplicates in a row one random proposal.
   A search ends when a target shape completes training (its final loss is known to the search);
   the cost is the training tokens spent until then. A search that never completes a target (a
   target was pruned and de-duplication never retrains it) is a miss, counted at the tokens it
   spent once every shape had been tried.
4. *Compare.* Mean tokens over 40 sampler seeds. The reference of the target is random search
   without pruning: Optuna's ``RandomSampler`` through the space's own parameters, every proposal
   trained in full (no de-duplication, which is part of the candidate). Two more references show
   where the gain comes from: the same with de-duplication (``nas search --sampler random
   --pruner none``), and members drawn uniformly (a textbook random search, independent of how
   the space parameterises its members; the hourglass space proposes the conventional baseline
   for half of all random draws). Target: >= 3x fewer tokens than the reference.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

from benchmarks.harness import BenchConfig, Figure

TARGET = 3.0
MAX_DUPLICATE_STREAK = 10  # as nas.study: after this many duplicates in a row, one random proposal
MAX_PROPOSALS = 5_000  # a replayed search that has not found a target by then is a miss
# the tiny preset's shape
SPACE_OPTIONS = {"layers": 4, "d_model": 32, "heads": 4, "vocab_size": 256, "tolerance": 0.01}
SMOKE_SPACE_OPTIONS = {"layers": 2, "d_model": 32, "heads": 4, "vocab_size": 256, "k_values": (1, 2),
                       "layer_values": (1, 2),
                           "ratio_values": (0.5, 1.0), "tolerance": 0.05}


@dataclass(frozen=True)
class Strategy:
    name: str
    sampler: str  # tpe | random
    prune: bool
    dedup: bool


STRATEGIES = (
    Strategy("random, no pruning, no de-dup (reference)", "random", False, False),
    Strategy("uniform over members, no pruning", "uniform", False, False),
    Strategy("random + de-dup", "random", False, True),
    Strategy("TPE + de-dup", "tpe", False, True),
    Strategy("TPE + median pruning + de-dup", "tpe", True, True),
)
CANDIDATE = STRATEGIES[-1].name


def train_config(smoke: bool):
    from runners.config import TrainConfig

    if smoke:
        return TrainConfig(tokens=512, batch_size=2, seq_len=32, lr=1e-2, eval_every=128, eval_tokens=128,
                           attention_batches=0, device="cpu")
    return TrainConfig(tokens=16_384, batch_size=8, seq_len=64, lr=3e-3, warmup_frac=0.1, eval_every=4_096,
                       eval_tokens=2_048, prune_eval_tokens=512, attention_batches=0, device="cpu")


def build_table(space, train, data, seeds=(0, 1)) -> dict[str, list[list[tuple[int, float]]]]:
    """Every member's evaluation curve for every seed: ``{key: [curve_seed0, curve_seed1]}``."""
    from runners.proxy import run

    table = {}
    for arch in space:
        curves = []
        for seed in seeds:
            result = run(arch, train.with_(seed=seed), data)
            curve = [(t, v if math.isfinite(v) else math.inf) for t, v in result.eval_curve]
            curves.append(curve or [(train.tokens, math.inf)])
        table[arch.key()] = curves
    return table


def targets_of(table) -> tuple[set[str], str, float, float]:
    """(target keys, best key, threshold, interaction sd): shapes within 1.96 sd of the best mean (module docstring)."""
    finals = {k: [c[-1][1] for c in curves] for k, curves in table.items()}
    means = {k: statistics.fmean(v) for k, v in finals.items()}
    pairs = [v for v in finals.values() if all(math.isfinite(x) for x in v)]
    sd = 0.0
    if len(pairs) > 1:
        shift = statistics.fmean(a - b for a, b in pairs)  # m0 - m1: the seeds' common offset
        sd = math.sqrt(sum(((a - b) - shift) ** 2 / 2 for a, b in pairs) / (len(pairs) - 1))
    best = min(means, key=means.get)
    threshold = means[best] + 1.96 * sd
    return {k for k, m in means.items() if m <= threshold}, best, threshold, sd


def simulate_uniform(space, table, targets: set[str], seed: int) -> tuple[int, int, bool]:
    """Textbook random search: the baseline, then members drawn uniformly with replacement, each trained in full."""
    import random

    rng = random.Random(seed)
    keys = [a.key() for a in space]
    key, tokens, trained = space.baseline().key(), 0, 0
    for _ in range(MAX_PROPOSALS):
        curve = table[key][seed % 2]
        tokens, trained = tokens + curve[-1][0], trained + 1
        if key in targets:
            return tokens, trained, True
        key = rng.choice(keys)
    return tokens, trained, False


def simulate(strategy: Strategy, space, table, targets: set[str], train, seed: int) -> tuple[int, int, bool]:
    """One replayed search: (training tokens spent, trials trained, found a target)."""
    if strategy.sampler == "uniform":
        return simulate_uniform(space, table, targets, seed)
    import optuna
    from optuna.trial import TrialState

    from nas.study.config import SearchConfig
    from nas.study.session import make_pruner, make_sampler

    config = SearchConfig(sampler=strategy.sampler, pruner="median" if strategy.prune else "none")
    study = optuna.create_study(sampler=make_sampler(config, seed), pruner=make_pruner(config, train))
    baseline = space.baseline()
    study.enqueue_trial(space.params_of(baseline))
    world = seed % 2
    done: dict[str, tuple[TrialState, float, int]] = {}  # key -> (state, last reported value, step)
    tokens = trained = streak = 0
    members = len(table)
    for _ in range(MAX_PROPOSALS):
        if streak >= MAX_DUPLICATE_STREAK:
            study.sampler, sampler = optuna.samplers.RandomSampler(seed=seed + len(study.trials)), study.sampler
            trial = study.ask()
            study.sampler = sampler
        else:
            trial = study.ask()
        arch = space.suggest(trial)
        key = arch.key()
        if strategy.dedup and key in done:
            state, value, step = done[key]
            if state == TrialState.COMPLETE:
                study.tell(trial, value)
            else:
                trial.report(value, step)
                study.tell(trial, state=TrialState.PRUNED)
            streak += 1
            if len(done) >= members:  # every shape tried and no target completed: its pruned trial is final
                return tokens, trained, False
            continue
        streak = 0
        trained += 1
        curve = table[key][world]
        may_prune = strategy.prune and key != baseline.key()  # nas search never prunes the baseline trial
        pruned = False
        for step, value in curve:
            trial.report(value, step)
            if may_prune and step < train.tokens and trial.should_prune():
                tokens += step
                done[key] = (TrialState.PRUNED, value, step)
                study.tell(trial, state=TrialState.PRUNED)
                pruned = True
                break
        if pruned:
            continue
        tokens += curve[-1][0]
        done[key] = (TrialState.COMPLETE, curve[-1][1], curve[-1][0])
        study.tell(trial, curve[-1][1])
        if key in targets:
            return tokens, trained, True
    return tokens, trained, False


def run(cfg: BenchConfig) -> Figure:
    import optuna

    from nas.data.loading import load_data
    from search_spaces.hourglass import HourglassSpace

    started = time.perf_counter()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = HourglassSpace(**(SMOKE_SPACE_OPTIONS if cfg.smoke else SPACE_OPTIONS))
    train = train_config(cfg.smoke).with_(threads=cfg.threads)
    data = load_data("builtin", cache_dir=cfg.cache_dir)
    t0 = time.perf_counter()
    table = build_table(space, train, data)
    table_s = time.perf_counter() - t0
    targets, best, threshold, sd = targets_of(table)
    n_seeds = 2 if cfg.smoke else 40
    rows, mean_tokens = [], {}
    for strategy in STRATEGIES:
        outcomes = [simulate(strategy, space, table, targets, train, seed) for seed in range(n_seeds)]
        spent = [o[0] for o in outcomes]
        mean_tokens[strategy.name] = statistics.fmean(spent)
        rows.append({"strategy": strategy.name, "mean tokens to find": statistics.fmean(spent),
                     "median tokens": statistics.median(spent),
                     "mean trials trained": statistics.fmean(o[1] for o in outcomes),
                     "found": f"{sum(o[2] for o in outcomes)}/{n_seeds}"})
    reference = mean_tokens[STRATEGIES[0].name]
    for row in rows:
        row["tokens vs reference"] = reference / row["mean tokens to find"] if row["mean tokens to find"] else math.inf
    ratio = rows[-1]["tokens vs reference"]
    label = {arch.key(): arch.label() for arch in space}
    finals = sorted((statistics.fmean(c[-1][1] for c in curves), key) for key, curves in table.items())
    return Figure(
        number=6, name="search_efficiency", title="Search efficiency: tokens to find the best shape (replay)",
        target=f">= {TARGET:g}x fewer training tokens than random search without pruning",
        method=(f"hourglass space of {space.count()} shapes (budget {space.budget:,} params) trained once per seed "
                f"(2 seeds, {train.tokens:,} tokens each, eval every {train.eval_every:,}; {table_s:.0f} s); "
                f"best {label[best]} at {finals[0][0]:.4f}; shape x seed sd {sd:.4f}; {len(targets)} target shape(s) "
                f"within 1.96 sd (loss <= {threshold:.4f}); {n_seeds} replayed searches per strategy "
                "(sampler seeds 0..n-1, each seeing seed (n mod 2)'s curves); see the module docstring"),
        columns=["strategy", "mean tokens to find", "median tokens", "mean trials trained", "found",
                 "tokens vs reference"],
        rows=rows, passed=ratio >= TARGET,
        summary=(f"{ratio:.2f}x fewer tokens than random search ({len(targets)}/{space.count()} target shapes); "
                 f"{ratio / rows[1]['tokens vs reference']:.2f}x vs uniform random over members, "
                 f"{ratio / rows[2]['tokens vs reference']:.2f}x vs random + de-dup"),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
