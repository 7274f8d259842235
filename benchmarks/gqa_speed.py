"""Figure 12, grouped-query attention: training tokens/s of GQA shapes against multi-head attention, and the cache.

At the default proxy shape (L12 d96 h12, head dim 8) and at d256 (L6 h8, head dim 32, figure 4's shape), with
uniform heads, each shape trained with the proxy's step and interleaved with the multi-head baseline:

- *attention only*: each group size with the baseline's FFN (fewer parameters: W_K, W_V shrink), what grouped
  key/value heads cost or save in the attention itself; target: at least 0.97 of the baseline's tokens/s
  (grouped heads are never repeated, so they should cost nothing; multi-head shapes keep today's path);
- *budget-matched*: the members of ``--space prism --kv-groups`` (``search_spaces.grouped``), whose FFN takes
  the saved parameters (the baseline's count, and FLOPs); reported, as figure 3 reports the Hourglass stacks:
  an exact budget gives the FFN an odd width (``wider`` sub-MLPs one wider), which matmuls run less well;
- *kernels*: one group size (baseline's FFN) through SDPA's ``enable_gqa`` instead of the CPU kernels, and through
  the PyTorch ops instead of the fused C kernels (``GroupedBlockedCausalAttention`` instead of the fused attention
  at head dims 8-16, ``RotaryGroupedQKV``'s RoPE and the causal softmax in PyTorch ops).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.harness import BenchConfig, Figure, ours_loss, random_batch, sandwich, training_step, under

TARGET = 0.97
# (layers, d_model, heads, seq_len, batch, rounds, group sizes, the group size whose kernel paths are compared)
SHAPES = ((12, 96, 12, 128, 4, 8, (2, 3, 4, 12), 3),
          (6, 256, 8, 256, 16, 4, (2, 4, 8), 4))
SMOKE_SHAPES = ((2, 32, 4, 32, 2, 1, (2,), 2),)
DEFAULT, MATCHED = "as shipped (fused kernels)", "budget-matched FFN"


@contextlib.contextmanager
def sdpa_attention() -> Iterator[None]:
    """Attention through SDPA (``enable_gqa`` for grouped layers) instead of the CPU blocked kernels."""
    from nas.model import transformer

    blocked = transformer.use_blocked_attention
    transformer.use_blocked_attention = lambda *args: False
    try:
        yield
    finally:
        transformer.use_blocked_attention = blocked


def ffn_text(arch: Any) -> str:
    """``688``, or ``853+2`` when 2 sub-MLPs are one wider."""
    return f"{arch.ffn.hidden}+{arch.ffn.wider}" if arch.ffn.wider else str(arch.ffn.hidden)


def run(cfg: BenchConfig) -> Figure:
    import torch

    from nas.arch import format_plateaus, uniform
    from nas.model import fused_cpu
    from nas.model.transformer import Transformer
    from search_spaces.grouped import UniformGroupPrismSpace
    from search_spaces.kv import KVRule
    from search_spaces.prism import PrismSpace

    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for layers, d_model, heads, seq_len, batch_size, rounds, groups, compared in (
            SMOKE_SHAPES if cfg.smoke else SHAPES):
        base = uniform(layers, d_model, heads, 256)
        space = UniformGroupPrismSpace(PrismSpace(layers, d_model, heads, vocab_size=256),
                                       KVRule.build(heads, groups))
        shapes = {}
        for g in groups:
            shapes[(g, DEFAULT)] = base.replace(kv_heads=[heads // g] * layers)
            shapes[(g, MATCHED)] = space.spaces[g].baseline()  # the member a search trains: the same budget
            assert space.validate(shapes[(g, MATCHED)]) == []
        batch = random_batch(base.vocab_size, batch_size, seq_len, cfg.device)

        def step_of(arch, batch=batch):
            torch.manual_seed(cfg.seed)
            return training_step(Transformer(arch), ours_loss, batch, cfg.device, cfg.dtype, 1)

        contenders = {key: step_of(arch) for key, arch in shapes.items()}
        compared_step = contenders[(compared, DEFAULT)]
        for path, context in (("SDPA enable_gqa + fused RoPE", sdpa_attention),
                              ("blocked, PyTorch ops", lambda: fused_cpu.enabled(False))):
            shapes[(compared, path)] = shapes[(compared, DEFAULT)]
            contenders[(compared, path)] = under(context, compared_step)
        named = {f"{g} {path}": step for (g, path), step in contenders.items()}
        ratios = sandwich(step_of(base), named, 1 if cfg.smoke else rounds, cfg.device)
        tokens = batch_size * seq_len
        shape = f"L{layers} d{d_model} h{heads} (head dim {d_model // heads}) B{batch_size} T{seq_len}"
        reference = statistics.median(r.ref_seconds for r in ratios.values())  # the baseline beside every contender
        rows.append({"shape": shape, "group size": 1, "kv heads": format_plateaus(base.heads),
                     "path": "multi-head baseline", "FFN": ffn_text(base), "params": base.n_params()["total"],
                     "KV bytes/token": base.kv_cache_bytes_per_token(), "KV vs baseline": 1.0,
                     "tokens/s": tokens / reference, "ratio": 1.0, "IQR": "-"})
        for (g, path), arch in shapes.items():
            r = ratios[f"{g} {path}"]
            rows.append({"shape": shape, "group size": g, "kv heads": format_plateaus(arch.kv_heads), "path": path,
                         "FFN": ffn_text(arch), "params": arch.n_params()["total"],
                         "KV bytes/token": arch.kv_cache_bytes_per_token(),
                         "KV vs baseline": arch.kv_cache_bytes_per_token() / base.kv_cache_bytes_per_token(),
                         "tokens/s": tokens / r.seconds, "ratio": r.median, "IQR": r.spread()})
    attention = [r for r in rows if r["path"] == DEFAULT]
    matched = [r for r in rows if r["path"] == MATCHED]
    worst = min(attention, key=lambda r: r["ratio"])

    def span(chosen: list[dict[str, Any]]) -> str:
        values = sorted(r["ratio"] for r in chosen)
        return f"{values[0]:.2f}-{values[-1]:.2f}"

    kernels = "; ".join(f"g={r['group size']} {r['path'].split(' +')[0].split(',')[0]} {r['ratio']:.2f}"
                        for r in rows if r["path"] not in (DEFAULT, MATCHED, "multi-head baseline"))
    return Figure(
        number=13, name="gqa_speed", title="Grouped-query attention: tokens/s vs multi-head, and the KV cache",
        target=f"attention only (the baseline's FFN): ratio >= {TARGET} for every group size",
        method=(f"uniform heads, {cfg.dtype}, {cfg.device}; full training steps (forward, backward, clip, fused "
                "AdamW) interleaved R C R C ... with the multi-head baseline, ratio = baseline time / shape time, "
                "median over rounds; budget-matched rows are the members of --space prism --kv-groups (the FFN "
                "takes the saved parameters); the kernel rows run one grouped shape through SDPA's enable_gqa "
                "instead of the blocked kernel, or with the fused C kernels off"),
        columns=["shape", "group size", "kv heads", "path", "FFN", "params", "KV bytes/token", "KV vs baseline",
                 "tokens/s", "ratio", "IQR"],
        rows=rows, passed=all(r["ratio"] >= TARGET for r in attention),
        summary=(f"attention only {span(attention)} (min g={worst['group size']}, {worst['shape'].split(' (')[0]}), "
                 f"budget-matched {span(matched)}; kernels: {kernels}"),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
