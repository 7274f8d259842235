"""Figure 2: our ``Transformer`` vs HF transformers ``LlamaForCausalLM`` at equal shape, dtype and optimiser.

Both models are the same function: uniform heads, K = 1 SwiGLU, tied embeddings, RoPE, RMSNorm;
HF with ``attn_implementation="sdpa"`` and ``use_cache=False``. Before timing, HF gets our
weights and the logits are compared (the "max rel. logit diff" column), so the two sides
provably compute the same model. Same batch, same loss (mean next-token cross-entropy), same
clipping and fused AdamW. Targets: ratio >= 1.15 at the default proxy shape, >= 1.0 elsewhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from benchmarks.harness import BenchConfig, Figure, ours_loss, random_batch, sandwich, training_step

DEFAULT_TARGET, OTHER_TARGET = 1.15, 1.0


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    d_model: int
    heads: int
    vocab: int
    seq_len: int
    batch: int
    steps: int  # steps per timed block
    rounds: int


SHAPES = (
    Shape("default proxy", 12, 96, 12, 256, 128, 4, 2, 8),
    Shape("d128", 4, 128, 4, 256, 128, 8, 2, 6),
    Shape("d256", 6, 256, 8, 256, 256, 8, 1, 6),
    Shape("d384", 8, 384, 6, 256, 128, 8, 1, 5),
)
SMOKE_SHAPES = (Shape("default proxy", 12, 96, 12, 256, 128, 4, 1, 1), Shape("d128", 2, 128, 4, 256, 64, 2, 1, 1))


def hf_model(arch, seq_len: int):
    """An HF ``LlamaForCausalLM`` of ``arch`` (uniform heads, K = 1) with fresh weights."""
    import transformers

    from nas.hf.mapping import llama_config_fields

    config = transformers.LlamaConfig(**llama_config_fields(arch, max(seq_len, 128)), use_cache=False)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")


def load_ours_into_hf(ours, hf) -> None:
    """Copy our weights into the HF model (``nas.hf.mapping``: W_Q, W_K, W_V are row blocks of ``qkv``, gate and up
    of ``gate_up``; the export's own mapping)."""
    import torch

    from nas.hf.mapping import hf_state_dict

    with torch.no_grad():
        hf.load_state_dict(hf_state_dict(ours.state_dict(), ours.arch, "llama"), strict=False)


def hf_loss(model, x, y):
    import torch.nn.functional as F

    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


def logit_difference(ours, hf, x) -> float:
    """max |ours - HF| / max |HF| over the logits of ``x`` (eval mode, fp32)."""
    import torch

    with torch.no_grad():
        a, b = ours.eval()(x), hf.eval()(input_ids=x, use_cache=False).logits
    ours.train(), hf.train()
    return float((a - b).abs().max() / b.abs().max())


def run(cfg: BenchConfig) -> Figure:
    import torch

    from nas.arch import FFNShape, llama_ffn_hidden, uniform
    from nas.model.transformer import Transformer

    started = time.perf_counter()
    rows = []
    for shape in SMOKE_SHAPES if cfg.smoke else SHAPES:
        arch = uniform(shape.layers, shape.d_model, shape.heads, shape.vocab,
                       FFNShape(1, llama_ffn_hidden(shape.d_model)))
        torch.manual_seed(cfg.seed)
        ours = Transformer(arch)
        hf = hf_model(arch, shape.seq_len)
        load_ours_into_hf(ours, hf)
        batch = random_batch(shape.vocab, shape.batch, shape.seq_len, cfg.device)
        diff = logit_difference(ours.to(cfg.device), hf.to(cfg.device), batch[0])
        ratio = sandwich(training_step(hf, hf_loss, batch, cfg.device, cfg.dtype, shape.steps),
                         {"ours": training_step(ours, ours_loss, batch, cfg.device, cfg.dtype, shape.steps)},
                         shape.rounds, cfg.device)["ours"]
        tokens = shape.steps * shape.batch * shape.seq_len
        target = DEFAULT_TARGET if shape.name == "default proxy" else OTHER_TARGET
        rows.append({"shape": shape.name, "L": shape.layers, "d": shape.d_model, "h": shape.heads,
                     "head dim": shape.d_model // shape.heads, "V": shape.vocab, "T": shape.seq_len, "B": shape.batch,
                     "ours tokens/s": tokens / ratio.seconds, "HF tokens/s": tokens / ratio.ref_seconds,
                     "ratio": ratio.median, "IQR": ratio.spread(), "target": target,
                     "max rel. logit diff": diff})
        del ours, hf
    passed = all(r["ratio"] >= r["target"] for r in rows) and all(r["max rel. logit diff"] <= 1e-5 for r in rows)
    default = rows[0]
    return Figure(
        number=2, name="vs_hf", title="Our model vs HF LlamaForCausalLM (training tokens/s)",
        target=f">= {DEFAULT_TARGET} at the default proxy shape, >= {OTHER_TARGET} at every shape",
        method=(f"uniform heads, K=1 SwiGLU (LLaMA width), tied embeddings, {cfg.dtype}, {cfg.device}; HF "
                "LlamaForCausalLM._from_config(..., attn_implementation='sdpa'), use_cache=False, loaded with "
                "our weights (logits compared); identical batch, cross-entropy, clipping and fused AdamW; "
                "blocks of steps interleaved HF ours HF ours ..., ratio = HF time / our time, median over rounds"),
        columns=["shape", "L", "d", "h", "head dim", "V", "T", "B", "ours tokens/s", "HF tokens/s", "ratio", "IQR",
                 "target", "max rel. logit diff"],
        rows=rows, passed=passed,
        summary=f"default proxy {default['ratio']:.2f}x; min over shapes "
                f"{min(r['ratio'] for r in rows):.2f}x",
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
