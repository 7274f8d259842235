"""Figure 5, search overhead: the fixed per-trial cost around training, as a share of a default trial.

One real default trial (``runners.proxy.run``, preset ``cpu``, baseline shape, builtin data)
gives the training time and the run's wall time; its pieces are re-timed one by one on the
same model and data (model build, validation batches, the intermediate evaluations on the
short pruning slice, the final evaluation, which also measures the attention distance). The study's own cost per trial
(sampler proposal, de-duplication lookups, heartbeat, storage writes of every attribute and
intermediate value in a SQLite study) is measured by running a default ``nas.study.parallel.run_search``
(prism space, 200 trials, TPE, median pruner) for 40 trials with the training replaced by a
stub that replays the real trial's result: everything but training.
Target: overhead <= 5 % of the trial's wall time (training + overhead).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import zlib
from dataclasses import replace

from benchmarks.harness import BenchConfig, Figure

TARGET = 0.05


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def trial_pieces(arch, train, data, reps: int) -> dict[str, float]:
    """Run one trial, then re-time its non-training pieces on the same shape and data."""
    import torch

    from nas.data.loading import validation_batches
    from nas.model.transformer import Transformer
    from runners.proxy import build_optimizer, evaluate, final_evaluation, run

    device = torch.device("cpu")
    run(arch, train.with_(tokens=2 * train.tokens_per_step), data)  # warm-up: a search worker runs many trials
    result = run(arch, train, data)
    val = validation_batches(data.val, train.batch_size, train.seq_len, train.eval_tokens)
    n_prune = max(1, (train.prune_eval_tokens or train.eval_tokens) // train.tokens_per_step)  # as runners.proxy
    model = Transformer(arch)
    n_mid = max(0, len(result.eval_curve) - 1)
    pieces = {
        "model build + optimizer": _median_time(lambda: build_optimizer(Transformer(arch), train, device), reps),
        "validation batches": _median_time(
            lambda: validation_batches(data.val, train.batch_size, train.seq_len, train.eval_tokens), reps),
        f"intermediate evaluations ({n_mid} x {len(val[:n_prune]) * train.tokens_per_step} tokens)":
            n_mid * _median_time(lambda: evaluate(model, val[:n_prune], device, train.dtype), reps),
        f"final evaluation ({len(val) * train.tokens_per_step} tokens) with attention distance "
        f"({train.attention_batches} batch)":
            _median_time(lambda: final_evaluation(model, val, train.attention_batches, device, train.dtype), reps),
    }
    measured = sum(pieces.values())
    pieces["batch sampling, loop, rest"] = max(0.0, result.wall_time_s - result.train_time_s - measured)
    return {"result": result, "train_s": result.train_time_s, "wall_s": result.wall_time_s, "pieces": pieces}


class _Enough(Exception):
    """Raised from the progress callback to end the stubbed search after enough trials."""


def study_overhead(result, trials: int, cache_dir: str | None, preset: str) -> tuple[float, float]:
    """Seconds per counted trial of a default ``nas search`` with training stubbed out: (over all, over the last half).

    The study is the default one (``SearchConfig()``: prism space of the preset, 200 trials, TPE,
    median pruner) in a fresh SQLite file; it is stopped after ``trials`` counted trials.
    """
    import nas.study.trial as study_module
    from nas.study.config import SearchConfig
    from nas.study.parallel import run_search

    if not hasattr(study_module, "run_proxy"):
        raise RuntimeError("nas.study.trial.run_proxy is gone: update benchmarks/overhead.py to stub the new "
                           "training call")

    def stub(arch, train, data, report=None):
        offset = (zlib.crc32(arch.key().encode()) % 1000) / 1e4  # a stable per-shape loss difference for the sampler
        out = replace(result, eval_curve=[], status="ok")
        for tokens, loss in result.eval_curve:
            out.eval_curve.append((tokens, loss + offset))
            out.val_loss = loss + offset
            if report is not None and report(tokens, loss + offset) and tokens < train.tokens:
                out.status = "pruned"
                break
        return out

    stamps: list[tuple[float, int]] = []  # (time, counted trials) after each trial, duplicates included

    def on_event(event) -> None:
        stamps.append((time.perf_counter(), event.counted))
        if event.counted >= trials:
            raise _Enough

    original = study_module.run_proxy
    with tempfile.TemporaryDirectory() as tmp:
        config = SearchConfig(preset=preset, storage=f"sqlite:///{os.path.join(tmp, 'bench.db')}", cache_dir=cache_dir)
        study_module.run_proxy = stub
        try:
            run_search(config, on_event=on_event, on_start=lambda search: stamps.append((time.perf_counter(), 0)))
        except _Enough:
            pass
        finally:
            study_module.run_proxy = original
    (t_first, _), (t_last, n_last) = stamps[0], stamps[-1]
    t_half, n_half = next((t, n) for t, n in stamps if n >= n_last // 2)
    late = (t_last - t_half) / (n_last - n_half) if n_last > n_half else (t_last - t_first) / max(1, n_last)
    return (t_last - t_first) / max(1, n_last), late


PLANNED_STUDIES = (("the default search's replicate phase: 129 shapes, 200 trials", 129, 200),
                   ("a small space replicated for hours: 5 shapes x 1,000 seeds", 5, 5000))


def adaptive_plan_seconds(shapes: int, trials: int, reps: int, seed: int = 0) -> float:
    """Median seconds of one adaptive plan (``nas.study.adaptive.next_shape``, what a worker calls before each
    replicate trial) on a simulated study: ``shapes`` shapes on seed 0, then the baseline and the 7 best of them in
    turn on seeds 1, 2, ... until ``trials`` scores (a score: a shape level, a seed effect and run noise)."""
    import random

    from nas.stats.scores import ShapeScores
    from nas.study.adaptive import next_shape, warmup_shapes

    rng = random.Random(seed)
    keys = [f"s{i}" for i in range(shapes)]
    levels = {k: 2.9 + rng.gauss(0, 0.06) for k in keys}
    effects: dict[int, float] = {}
    runs: dict[str, list[tuple[int, int, float]]] = {k: [] for k in keys}
    replicated: list[str] = []
    for number in range(trials):
        if number == shapes:  # after the first pass: the baseline and the first pass's best, round by round
            replicated = [keys[0], *sorted(keys[1:], key=lambda k: runs[k][0][2])][:8]
        key, seed_of = (keys[number], 0) if number < shapes else (replicated[(number - shapes) % len(replicated)],
                                                                  1 + (number - shapes) // len(replicated))
        effect = effects.setdefault(seed_of, rng.gauss(0, 0.1))
        runs[key].append((number, seed_of, levels[key] + effect + rng.gauss(0, 0.08)))
    while True:  # as the planner does first: the baseline and the 4 best have the second seed (the warm-up)
        scores = {k: ShapeScores(k, *(tuple(c) for c in zip(*rows))) for k, rows in runs.items()}
        waiting = [k for k in warmup_shapes(scores, keys[0]) if 1 not in scores[k].seeds]
        if not waiting:
            break
        runs[waiting[0]].append((trials + len(waiting), 1, levels[waiting[0]] + effects[1] + rng.gauss(0, 0.08)))
    trained = {k: set(score.seeds) for k, score in scores.items()}
    return _median_time(lambda: next_shape(scores, keys[0], 0, trained), reps)


def run(cfg: BenchConfig) -> Figure:
    from nas.data.loading import load_data
    from runners.presets import get_preset

    started = time.perf_counter()
    name = "tiny" if cfg.smoke else "cpu"
    preset = get_preset(name)
    t0 = time.perf_counter()
    data = load_data("builtin", cache_dir=cfg.cache_dir)
    load_s = time.perf_counter() - t0
    arch = preset.baseline.replace(vocab_size=max(preset.baseline.vocab_size, data.vocab_size))
    train = preset.train.with_(threads=cfg.threads, device="cpu", seed=cfg.seed)
    study_trials = 3 if cfg.smoke else 40
    label = "preset " + name
    trial = trial_pieces(arch, train, data, 1 if cfg.smoke else 3)
    mean_study, per_trial_study = study_overhead(trial["result"], study_trials, cfg.cache_dir, name)
    pieces = {"training (forward, backward, optimizer)": trial["train_s"], **trial["pieces"],
              f"study: sampler, de-dup, storage (per trial, trials {study_trials // 2}-{study_trials} of a default "
              f"search; {mean_study:.2f} s over all {study_trials})": per_trial_study}
    wall = trial["wall_s"] + per_trial_study
    rows = [{"setup": label, "piece": piece, "seconds": seconds, "share of trial": seconds / wall}
            for piece, seconds in pieces.items()]
    overhead = wall - trial["train_s"]
    rows.append({"setup": label, "piece": "**total fixed cost**", "seconds": overhead,
                 "share of trial": overhead / wall})
    rows.append({"setup": "once per worker", "piece": "data load (builtin, cached; not per trial)", "seconds": load_s,
                 "share of trial": float("nan")})
    for what, shapes, scores in PLANNED_STUDIES[:1] if cfg.smoke else PLANNED_STUDIES:
        plan_s = adaptive_plan_seconds(shapes, scores, 1 if cfg.smoke else 3, cfg.seed)
        rows.append({"setup": "per adaptive replicate trial", "piece": f"plan (nas.study.adaptive): {what}",
                     "seconds": plan_s, "share of trial": plan_s / wall})
    fraction = overhead / wall
    pieces_of_a_trial = [r for r in rows[1:] if r["setup"] == label and not r["piece"].startswith("**")]
    biggest = max(pieces_of_a_trial, key=lambda r: r["seconds"])  # a piece of the trial, not the total
    summary = f"{fraction:.1%} of a default trial (largest piece: {biggest['piece']}, {biggest['share of trial']:.1%})"
    return Figure(
        number=5, name="overhead", title="Search overhead: per-trial fixed cost",
        target=f"<= {TARGET:.0%} of a default trial",
        method=("one real trial of the baseline with the preset's TrainConfig (runners.proxy.run, builtin data); "
                "training = the run's train_time_s; pieces re-timed separately on the same model and data "
                "(median of repeats); 'rest' = wall - training - pieces; study cost = a default "
                "nas.study.parallel.run_search "
                "(SearchConfig(): 200 trials, TPE, median pruner, SQLite) with training replaced by a replay of the "
                "real trial's result (de-duplication, heartbeats, attribute writes included), seconds per counted "
                f"trial over trials {study_trials // 2}-{study_trials}; one warm-up run before the measured trial; "
                "adaptive plans timed on simulated studies (benchmarks.overhead.adaptive_plan_seconds), not in the "
                "total: a default search plans adaptively only after its first pass"),
        columns=["setup", "piece", "seconds", "share of trial"],
        rows=rows, passed=fraction <= TARGET, summary=summary,
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
