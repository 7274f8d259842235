"""FusedCausalAttention against BlockedCausalAttention: the kernels alone and whole proxy training steps.

``python -m benchmarks.fused_attention`` (``--smoke``: one round of small shapes) measures, as same-run ratios
(``benchmarks.harness.sandwich``: blocked, fused, blocked, ...; ratio = blocked time / fused time, median over
rounds):

- *kernels*: one attention layer's forward + backward at the default proxy's batch (B 4, T 128) and width (96
  channels: H = 96 / Dh heads), every head dim with a fused kernel and one without (48: the blocked path, for
  scale), at 1 thread (a search's worker) and at every core (``nas train``); and grouped-query attention at head
  dim 8 (4 query heads a key/value head) against ``GroupedBlockedCausalAttention``;
- *steps*: a full proxy training step (forward, backward, clip, fused AdamW) of three ``cpu``-preset shapes, the
  uniform baseline (12 heads: head dim 8 everywhere) and two Prism staircases, at 1 thread, with
  the fused attention forced off for the reference (every other kernel the same) and on for the contender
  (``FUSED_ATTENTION_FORCED``: without AVX-512 the model does not take it by default; the last line says which
  this machine takes).

``--noise`` adds what the proxy measures with each kernel: the two step shapes trained as the ``cpu`` preset's
trials (``runners.proxy.run``, one thread) at 12 seeds, each seed with both kernels in turn; the kernels agree up to
float rounding, which a trajectory amplifies, so the question is whether the scores' mean and seed spread change:
the paired mean difference (t test) and the ratio of seed variances (F test) per shape.

Writes ``benchmarks/data/fused_attention.json`` with the machine and its fp32 matmul peak beside the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "data" / "fused_attention.json"
# (head dim, query heads per key/value head): multi-head at each head dim, grouped-query (4 per key/value head) at 8
KERNELS = ((8, 1), (12, 1), (16, 1), (24, 1), (32, 1), (48, 1), (8, 4))
STEP_SHAPES = {"uniform 12 heads": (12,) * 12, "staircase 1-12": (1, 1, 2, 2, 4, 4, 6, 6, 8, 8, 12, 12),
               "staircase 4-12": (4, 4, 4, 6, 6, 6, 8, 8, 8, 12, 12, 12)}


@contextlib.contextmanager
def fused_attention(flag: bool) -> Iterator[None]:
    """Within the block every layer with a fused kernel takes it (``True``, also on CPUs where the model would not
    by default: ``attention_kernels.fused_attention_pays``) or takes BlockedCausalAttention (``False``)."""
    from nas.model import attention_kernels

    kept = attention_kernels.FUSED_ATTENTION_FORCED
    attention_kernels.FUSED_ATTENTION_FORCED = flag
    try:
        yield
    finally:
        attention_kernels.FUSED_ATTENTION_FORCED = kept


def blocked_only() -> contextlib.AbstractContextManager[None]:
    return fused_attention(False)


def fused_everywhere() -> contextlib.AbstractContextManager[None]:
    return fused_attention(True)


def attention_layer(batch: int, seq_len: int, width: int, head_dim: int, fused: bool,
                    group: int = 1) -> Callable[[], None]:
    """One layer's attention, forward and backward, as the model calls it (q already scaled, output (B, T, H, Dh));
    ``group`` > 1: grouped-query, H / group key/value heads, against ``GroupedBlockedCausalAttention``."""
    import torch

    from nas.model.attention_kernels import BlockedCausalAttention, FusedCausalAttention, GroupedBlockedCausalAttention

    heads = width // head_dim
    kv = heads // group
    torch.manual_seed(0)
    q = torch.randn(batch, heads, seq_len, head_dim, requires_grad=True)
    k, v = (torch.randn(batch, kv, seq_len, head_dim, requires_grad=True) for _ in range(2))
    d_out = torch.randn(batch, seq_len, heads, head_dim)

    def run() -> None:
        if fused:
            out = FusedCausalAttention.apply(q, k, v)
        elif group > 1:  # as nas.model.transformer.Attention calls it
            flat = (batch * kv, seq_len, head_dim)
            out = GroupedBlockedCausalAttention.apply(q.view(batch * kv, group, seq_len, head_dim), k.view(flat),
                                                      v.view(flat))
            out = out.unflatten(0, (batch, kv)).permute(0, 3, 1, 2, 4)
        else:
            flat = (batch * heads, seq_len, head_dim)
            out = BlockedCausalAttention.apply(q.view(flat), k.view(flat), v.view(flat))
            out = out.unflatten(0, (batch, heads)).transpose(1, 2)
        out.backward(d_out.view_as(out))

    return run


def repeated(step: Callable[[], None], times: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(times):
            step()

    return run


def measure(smoke: bool) -> dict[str, Any]:
    import torch

    from benchmarks.harness import ours_loss, random_batch, sandwich, training_step, under
    from nas.arch import uniform
    from nas.model.attention_kernels import FUSED_ATTENTION_HEAD_DIMS, fused_attention_pays
    from nas.model.transformer import Transformer
    from runners.cores import available_cores
    from runners.peak import measure_matmul_peak

    rounds = 1 if smoke else 7
    batch, seq_len, width = (2, 32, 96) if smoke else (4, 128, 96)
    kernels = []
    for threads in sorted({1, available_cores()}):
        torch.set_num_threads(threads)
        for head_dim, group in KERNELS if not smoke else ((8, 1), (8, 4), (48, 1)):
            reference = repeated(attention_layer(batch, seq_len, width, head_dim, False, group), 10)
            row = {"threads": threads, "head dim": head_dim, "group": group}
            if head_dim not in FUSED_ATTENTION_HEAD_DIMS:
                kernels.append({**row, "ratio": None, "note": "no fused kernel"})
                continue
            contender = repeated(attention_layer(batch, seq_len, width, head_dim, True, group), 10)
            r = sandwich(reference, {"fused": contender}, rounds)["fused"]
            kernels.append({**row, "blocked ms": r.ref_seconds * 100, "fused ms": r.seconds * 100, "ratio": r.median,
                            "IQR": r.spread()})
    torch.set_num_threads(1)
    steps = []
    layers = 2 if smoke else 12
    x_y = random_batch(256, batch, seq_len, "cpu")
    for name, heads in STEP_SHAPES.items():
        arch = uniform(layers, width, 12, 256).replace(heads=list(heads[-layers:]))
        torch.manual_seed(0)
        step = training_step(Transformer(arch), ours_loss, x_y, "cpu", "fp32", 3)
        r = sandwich(under(blocked_only, step), {"fused": under(fused_everywhere, step)}, rounds)["fused"]
        tokens = 3 * batch * seq_len
        steps.append({"shape": name, "heads": list(arch.heads), "blocked tokens/s": tokens / r.ref_seconds,
                      "fused tokens/s": tokens / r.seconds, "ratio": r.median, "IQR": r.spread()})
    torch.set_num_threads(available_cores())
    return {"kernels": kernels, "steps": steps, "fused by default here": fused_attention_pays(),
            "peak_gflops": measure_matmul_peak(torch.device("cpu")) / 1e9, "smoke": smoke}


def proxy_noise(smoke: bool) -> list[dict[str, Any]]:
    """Per step shape: the final validation loss of ``cpu``-preset trials, fused and blocked attention at each seed."""
    import statistics

    import torch
    from scipy import stats

    from nas.data.loading import load_data
    from runners.presets import PRESETS
    from runners.proxy import run

    torch.set_num_threads(1)
    preset = PRESETS["tiny" if smoke else "cpu"]
    data = load_data("builtin")
    seeds = range(3 if smoke else 12)
    rows = []
    for name, heads in STEP_SHAPES.items():
        if smoke:
            heads = (4,) * preset.baseline.n_layers  # the tiny preset's width 32: head dim 8
        arch = preset.baseline.replace(heads=list(heads))
        fused, blocked = [], []
        for seed in seeds:
            cfg = preset.train.with_(seed=seed, threads=1)
            with fused_everywhere():
                fused.append(run(arch, cfg, data).val_loss)
            with blocked_only():
                blocked.append(run(arch, cfg, data).val_loss)
        variance_ratio = statistics.variance(fused) / statistics.variance(blocked)
        df = len(fused) - 1
        rows.append({"shape": name, "seeds": len(fused), "fused": fused, "blocked": blocked,
                     "mean difference": statistics.mean(f - b for f, b in zip(fused, blocked)),
                     "paired t p": float(stats.ttest_rel(fused, blocked).pvalue),
                     "seed sd fused": statistics.stdev(fused), "seed sd blocked": statistics.stdev(blocked),
                     "variance ratio": variance_ratio,
                     "F p": float(2 * min(stats.f.sf(variance_ratio, df, df), stats.f.cdf(variance_ratio, df, df)))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fused_attention", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one round of small shapes (proves it runs)")
    parser.add_argument("--noise", action="store_true", help="also train the step shapes at 12 seeds with each "
                        "kernel: does the proxy's mean or seed spread change? (~3 min)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    from benchmarks.harness import machine_info

    result = measure(args.smoke)
    if args.noise:
        result["noise"] = proxy_noise(args.smoke)
    result["machine"] = machine_info(os.cpu_count() or 1, "cpu")
    for row in result["kernels"]:
        shown = "no fused kernel" if row["ratio"] is None else \
            f"blocked {row['blocked ms']:.2f} ms, fused {row['fused ms']:.2f} ms: {row['ratio']:.2f}x ({row['IQR']})"
        grouped = f", {row['group']} query heads a key/value head" if row["group"] > 1 else ""
        print(f"kernel  {row['threads']} thread(s), head dim {row['head dim']:>2}{grouped}: {shown}")
    for row in result["steps"]:
        print(f"step    {row['shape']}: {row['blocked tokens/s']:,.0f} -> {row['fused tokens/s']:,.0f} tokens/s, "
              f"{row['ratio']:.2f}x ({row['IQR']})")
    for row in result.get("noise", []):
        print(f"noise   {row['shape']}, {row['seeds']} seeds: fused - blocked {row['mean difference']:+.4f} nats "
              f"(paired t p {row['paired t p']:.2f}); seed sd {row['seed sd fused']:.4f} fused, "
              f"{row['seed sd blocked']:.4f} blocked (F {row['variance ratio']:.2f}, p {row['F p']:.2f})")
    print(f"fp32 matmul peak {result['peak_gflops']:.0f} GFLOP/s (every core); the model takes the fused attention "
          f"by default here: {'yes' if result['fused by default here'] else 'no (no AVX-512)'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
