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
    fraction = overhead / wall
    biggest = max(rows[1:-2], key=lambda r: r["seconds"])
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
                f"trial over trials {study_trials // 2}-{study_trials}; one warm-up run before the measured trial"),
        columns=["setup", "piece", "seconds", "share of trial"],
        rows=rows, passed=fraction <= TARGET, summary=summary,
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
