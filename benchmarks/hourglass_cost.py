"""Figure 3, hourglass cost: tokens/s of K = 2, 4, 8 hourglass FFN stacks vs the conventional FFN, same budget.

Shapes come from ``HourglassSpace(..., fix="attention")`` around the default proxy shape: L,
d_model and attention stay the baseline's and ``d_h`` follows from the parameter budget
(``K d_h`` ~ the conventional width), so the only difference is a deeper stack of narrower
sub-MLPs, each with its own RMSNorm and residual add: K sequential matmul pairs instead of one.
No target: the figure makes the cost visible.
"""

from __future__ import annotations

import time

from benchmarks.harness import BenchConfig, Figure, ours_loss, random_batch, sandwich, training_step

K_VALUES = (2, 4, 8)


def run(cfg: BenchConfig) -> Figure:
    import torch

    from nas.model.transformer import Transformer
    from runners.presets import get_preset
    from search_spaces.hourglass import HourglassSpace

    started = time.perf_counter()
    preset = get_preset("cpu")
    base, train = preset.baseline, preset.train
    space = HourglassSpace(base.n_layers, base.d_model, base.heads[0], vocab_size=base.vocab_size,
                           k_values=(1, *K_VALUES), fix="attention", tolerance=0.01)  # K norms add ~0.6 %
    shapes = {a.ffn.k: a for a in space if a.ffn.k in K_VALUES}
    steps, rounds = (1, 1) if cfg.smoke else (2, 6)
    if cfg.smoke:
        shapes = {k: shapes[k] for k in (2, 8)}
    batch = random_batch(base.vocab_size, train.batch_size, train.seq_len, cfg.device)

    def step_of(arch):
        torch.manual_seed(cfg.seed)
        return training_step(Transformer(arch), ours_loss, batch, cfg.device, cfg.dtype, steps)

    baseline = space.baseline()
    tokens = steps * train.batch_size * train.seq_len
    rows = []
    # 1 thread as well: the stack's many small ops pay the 2-thread fork/join on every op
    for threads in dict.fromkeys((cfg.threads, 1)):
        torch.set_num_threads(threads)
        ratios = sandwich(step_of(baseline), {f"K={k}": step_of(a) for k, a in shapes.items()}, rounds, cfg.device)
        for k, arch in shapes.items():
            r = ratios[f"K={k}"]
            rows.append({"threads": threads, "K": k, "d_h": arch.ffn.hidden, "params": arch.n_params()["total"],
                         "baseline params": baseline.n_params()["total"],
                         "budget deviation": f"{space.deviation(arch):+.3%}",
                         "tokens/s": tokens / r.seconds, "K=1 tokens/s": tokens / r.ref_seconds,
                         "ratio": r.median, "IQR": r.spread()})
    torch.set_num_threads(cfg.threads)
    return Figure(
        number=3, name="hourglass_cost", title="Hourglass cost: K-deep FFN stacks vs conventional FFN",
        target="report (make the cost visible)",
        method=(f"default proxy shape L{base.n_layers} d{base.d_model} h{base.heads[0]}, conventional FFN "
                f"d_ff={baseline.ffn.hidden}; hourglass shapes from HourglassSpace(fix='attention') at the same "
                f"parameter budget; B{train.batch_size} T{train.seq_len}, {cfg.dtype}; blocks of {steps} training "
                f"steps interleaved with the K=1 baseline ({rounds} rounds), ratio = K=1 time / K time; with all "
                f"threads, then with 1"),
        columns=["threads", "K", "d_h", "params", "baseline params", "budget deviation", "tokens/s", "K=1 tokens/s",
                 "ratio", "IQR"],
        rows=rows, passed=None,
        summary="; ".join(f"{t} thread{'s' * (t > 1)}: " + ", ".join(f"K={r['K']} {r['ratio']:.2f}x" for r in rows
                                                                    if r["threads"] == t)
                          for t in dict.fromkeys(r["threads"] for r in rows)),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
