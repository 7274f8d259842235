"""Figure 1, "Prism is free": training tokens/s of head schedules vs the uniform baseline at the default shape.

Every hardware-aligned schedule of the default proxy shape (``PrismSpace(12, 96, 12,
hw_aligned=True)``: head dims 8, 16, 32), plus schedules with head dims that are not powers of
two, each trained with the proxy's step (same batch, fused AdamW) and interleaved with the
uniform baseline. Target: every ratio >= 0.97.
"""

from __future__ import annotations

import time

from benchmarks.harness import BenchConfig, Figure, ours_loss, random_batch, sandwich, training_step

TARGET = 0.97
OTHERS = ("1x2,2x2,4x2,12x6", "4x3,8x3,12x6", "2x2,6x4,12x6", "8x4,12x8")  # head dims 96..12, not powers of two


def run(cfg: BenchConfig) -> Figure:
    import torch

    from nas.model.transformer import Transformer
    from runners.presets import get_preset
    from search_spaces.prism import PrismSpace, format_plateaus, parse_schedule

    started = time.perf_counter()
    preset = get_preset("cpu")
    base, train = preset.baseline, preset.train
    space = PrismSpace(base.n_layers, base.d_model, base.heads[0], vocab_size=base.vocab_size, hw_aligned=True)
    full = PrismSpace(base.n_layers, base.d_model, base.heads[0], vocab_size=base.vocab_size)
    schedules = [(a, "aligned") for a in space if a.key() != base.key()]
    schedules += [(full.member(parse_schedule(s)), "other") for s in OTHERS]
    assert all(full.contains(a) for a, _ in schedules), "every benchmarked schedule is a member of the prism space"
    if cfg.smoke:
        schedules = schedules[:2] + schedules[-1:]
    batch_size, seq_len = train.batch_size, train.seq_len
    steps, rounds = (1, 1) if cfg.smoke else (1, 12)  # many short rounds: the median needs samples, not long blocks
    batch = random_batch(base.vocab_size, batch_size, seq_len, cfg.device)

    def step_of(arch):
        torch.manual_seed(cfg.seed)
        return training_step(Transformer(arch), ours_loss, batch, cfg.device, cfg.dtype, steps)

    contenders = {format_plateaus(a.heads): step_of(a) for a, _ in schedules}
    ratios = sandwich(step_of(base), contenders, rounds, cfg.device)
    tokens = steps * batch_size * seq_len
    rows = []
    for arch, kind in schedules:
        r = ratios[format_plateaus(arch.heads)]
        rows.append({"schedule": format_plateaus(arch.heads),
                     "head dims": ",".join(map(str, sorted(set(arch.head_dims())))),
                     "kind": kind, "tokens/s": tokens / r.seconds, "uniform tokens/s": tokens / r.ref_seconds,
                     "ratio": r.median, "IQR": r.spread()})
    worst = min(rows, key=lambda row: row["ratio"])
    passed = all(row["ratio"] >= TARGET for row in rows)
    return Figure(
        number=1, name="prism_free", title="Prism is free: schedule tokens/s vs uniform",
        target=f"ratio >= {TARGET} for every schedule",
        method=(f"default proxy shape L{base.n_layers} d{base.d_model} h{base.heads[0]} V{base.vocab_size}, "
                f"B{batch_size} T{seq_len}, {cfg.dtype}, {cfg.device}; full training steps (forward, backward, "
                f"clip, fused AdamW); blocks of {steps} steps interleaved R C R C ... with the uniform "
                f"schedule ({rounds} rounds), ratio = uniform time / schedule time, median over rounds"),
        columns=["schedule", "head dims", "kind", "tokens/s", "uniform tokens/s", "ratio", "IQR"],
        rows=rows, passed=passed,
        summary=f"{len(rows)} schedules, min ratio {worst['ratio']:.2f} ({worst['schedule']}), "
                f"median {sorted(r['ratio'] for r in rows)[len(rows) // 2]:.2f}",
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
