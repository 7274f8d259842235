"""The decoder built from an ``ArchConfig``: LLaMA blocks with per-layer head counts and a K-deep SwiGLU stack.

Per layer ``l`` (pre-norm residual, Touvron et al. 2023)::

    x = x + W_O · SDPA(RoPE(W_Q n), RoPE(W_K n), W_V n)      n = RMSNorm(x), h_l heads of d/h_l, kv_l of them for K, V
    for k in 1..K:  x = x + W_down,k (silu(W_gate,k m) * W_up,k m)    m = RMSNorm_k(x)

With uniform heads and ``K = 1`` this is exactly HF ``LlamaForCausalLM`` (same RoPE
``rotate_half`` convention, same RMSNorm), so weights map one to one (tests check logits).

The forward path has no per-head Python loop: a layer's head count only changes a
``view``, so a Prism schedule costs what the uniform one costs. A grouped-query layer (``kv_l < h_l``, each
key/value head serving ``h_l / kv_l`` query heads in HF's ``repeat_kv`` order) never repeats k and v: SDPA's
``enable_gqa``, or on CPU ``GroupedBlockedCausalAttention``, which stacks a group's queries as rows of one
batched matmul; multi-head layers keep the paths below unchanged. Speed (``benchmarks/``, figure 2):
W_Q, W_K, W_V are one ``d -> 3d`` matmul and gate, up one
``d -> 2 d_h`` matmul; splitting q, k, v and rotating q, k is one autograd node
(``RotaryQKV``: no temporaries, one gradient buffer); on CPU up to T = 512, attention is
``BlockedCausalAttention`` instead of SDPA's flash kernel (``FusedCausalAttention``, one C call each way, at head
dims 8, 12, 16, 24 and 32 in fp32, grouped or not), and RMSNorm has its own backward
(``RMSNormFunction``, 6 passes instead of autograd's ~13 through ``F.rms_norm``), as does the gated
up-projection of wide FFNs (``GatedUpProjection``: no (N, 2F) gradient concatenation); these autograd
functions live in ``nas.model.kernels`` and ``nas.model.attention_kernels``. On CPU in fp32,
the elementwise parts of RoPE, RMSNorm, the SwiGLU gate and the causal softmax run as one-pass C kernels
(``nas.model.fused_cpu``, built on first use; PyTorch ops where no C compiler is found). All paths match HF
within float rounding (tests check logits and gradients).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import ArchConfig
from nas.model import fused_cpu
from nas.model.attention_kernels import (
    BlockedCausalAttention,
    FusedCausalAttention,
    GroupedBlockedCausalAttention,
    ProbabilityObserver,
    blocked_attention_forward,
    causal_mask,
    grouped_attention_forward,
    use_blocked_attention,
    use_fused_attention,
)
from nas.model.kernels import (
    GATED_UP_MIN_ELEMENTS,
    GatedUpProjection,
    RMSNormFunction,
    RotaryGroupedQKV,
    RotaryQKV,
    apply_function,
    plain_cpu_fp32,
)

INIT_STD = 0.02  # GPT-2 / LLaMA reference initialisation
# SDPA shares key/value heads among query heads itself from torch 2.5 (``enable_gqa``); before, they are repeated
SDPA_GQA = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def grouped_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of q (B, H, T, Dh) over k, v (B, KV, T, Dh) with KV dividing H (q already scaled): (B, H, T, Dh).

    Key/value head j serves query heads j g .. j g + g - 1 (HF's ``repeat_kv`` order), which SDPA's
    ``enable_gqa`` does without copying k and v."""
    if SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0, enable_gqa=True)
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1),
                                          is_causal=True, scale=1.0)


class RotaryTable(nn.Module):
    """cos/sin tables for one head dim, grown on demand: ``theta_i = base^(-2i/dim)`` (Su et al. 2021, RoFormer).

    Layout follows HF LLaMA (``rotate_half``): channel ``i`` of the first half pairs with channel
    ``i`` of the second, both turned by ``theta_i``. Only the half tables ``(T, rot/2)`` are kept,
    since HF's full tables are ``cat(half, half)``. An odd head dim rotates its first ``dim - 1`` channels.
    """

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.rot_dim = head_dim - head_dim % 2
        self.base = base
        self.register_buffer("cos", torch.empty(0, self.rot_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(0, self.rot_dim // 2), persistent=False)

    def table(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` of shape (seq_len, rot_dim / 2)."""
        if self.cos.shape[0] < seq_len or self.cos.device != device or self.cos.dtype != dtype:
            length = max(seq_len, self.cos.shape[0])
            channels = torch.arange(0, self.rot_dim, 2, device=device, dtype=torch.float32)  # (rot/2,)
            inv_freq = 1.0 / (self.base ** (channels / self.rot_dim))
            freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)  # (T, rot/2)
            self.cos, self.sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
        return self.cos[:seq_len], self.sin[:seq_len]


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in plain tensor ops (HF ``rotate_half`` pairing): (B, H, T, Dh) with half tables (T, rot/2)."""
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half:]], dim=-1)


class Attention(nn.Module):
    """Causal attention with this layer's own head count and key/value head count; parameters independent of the
    head count, W_K and W_V ``n_kv d_head x d`` (grouped-query attention when ``n_kv < n_heads``).

    ``reference_ops`` (``Transformer.use_reference_ops``): plain PyTorch ops only, RoPE as tensor
    arithmetic and SDPA, for ``torch.compile``, which fuses them itself and cannot trace the CPU
    kernels' ctypes calls.
    """

    reference_ops = False

    def __init__(self, d_model: int, n_heads: int, rotary: RotaryTable, n_kv: int | None = None) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.n_kv = n_heads if n_kv is None else n_kv
        self.qkv = nn.Linear(d_model, (n_heads + 2 * self.n_kv) * self.head_dim, bias=False)  # rows: W_Q, W_K, W_V
        self.out = nn.Linear(d_model, d_model, bias=False)  # W_O
        self.rotary = rotary

    @property
    def grouped(self) -> bool:
        return self.n_kv != self.n_heads

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, Dh) with RoPE applied, times 1/sqrt(Dh); k (RoPE applied), v: (B, KV, T, Dh)."""
        qkv = self.qkv(x)  # (B, T, (H + 2 KV) Dh)
        cos, sin = self.rotary.table(x.shape[1], qkv.device, qkv.dtype)
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.reference_ops:
            B, T, _ = qkv.shape
            if self.grouped:
                q, k, v = (part.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)  # (B, heads, T, Dh)
                           for part in qkv.split([self.n_heads * self.head_dim, self.n_kv * self.head_dim,
                                                  self.n_kv * self.head_dim], -1))
            else:
                q, k, v = qkv.view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            return rope_reference(q, cos, sin) * scale, rope_reference(k, cos, sin), v
        if self.grouped:
            return apply_function(RotaryGroupedQKV, qkv, cos, sin, self.n_heads, self.n_kv, scale)
        return apply_function(RotaryQKV, qkv, cos, sin, self.n_heads, scale)

    def forward(self, x: torch.Tensor, observe: ProbabilityObserver | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D). ``observe``, analysis only (no grad), is shown the attention probabilities."""
        B, T, D = x.shape
        if observe is not None and torch.is_grad_enabled():
            raise RuntimeError("attention observers are for analysis: call the model under torch.no_grad()")
        q, k, v = self._qkv(x)  # (B, H, T, Dh), (B, KV, T, Dh) twice
        blocked = not self.reference_ops and use_blocked_attention(x.device, B * self.n_heads, T, q.element_size())
        if blocked and observe is None and use_fused_attention(q):
            y = apply_function(FusedCausalAttention, q, k, v)  # (B, T, H, Dh)
        elif blocked and self.grouped:
            grouped = (B * self.n_kv, self.n_heads // self.n_kv, T, self.head_dim)  # (N, g, T, Dh) view of q
            flat = (B * self.n_kv, T, self.head_dim)
            if observe is None:
                y = apply_function(GroupedBlockedCausalAttention, q.view(grouped), k.view(flat), v.view(flat))
            else:
                y = grouped_attention_forward(q.view(grouped), k.view(flat), v.view(flat), observe)[0]
            y = y.unflatten(0, (B, self.n_kv)).permute(0, 3, 1, 2, 4)  # (B, T, KV, g, Dh): head kv g + j
        elif blocked:
            flat = (B * self.n_heads, T, self.head_dim)
            if observe is None:
                y = apply_function(BlockedCausalAttention, q.view(flat), k.view(flat), v.view(flat))  # (BH, T, Dh)
            else:
                y = blocked_attention_forward(q.view(flat), k.view(flat), v.view(flat), observe)[0]
            y = y.unflatten(0, (B, self.n_heads)).transpose(1, 2)  # (B, T, H, Dh)
        elif observe is not None:
            y, probs = self._explicit_attention(q, k, v)
            observe(0, probs.flatten(0, 1))
        elif self.grouped:
            y = grouped_sdpa(q, k, v).transpose(1, 2)  # (B, T, H, Dh)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0).transpose(1, 2)  # (B, T, H, Dh)
        return self.out(y.reshape(B, T, D))

    def explicit(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same attention with the probabilities materialised: (output (B, T, D), P (B, H, T, T)).

        ``P = softmax(QK^T / sqrt(Dh) + causal mask)``; output ``= W_O (P V)``. Analysis only: O(T^2) memory.
        """
        B, T, D = x.shape
        y, probs = self._explicit_attention(*self._qkv(x))
        return self.out(y.reshape(B, T, D)), probs

    def _explicit_attention(self, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(P V as (B, T, H, Dh), P (B, H, T, T)) from q (already times 1/sqrt(Dh)) (B, H, T, Dh), k, v (B, KV, T, Dh).

        A group's g query heads are stacked as g T rows against their key/value head: no repeated k or v."""
        B, H, T, Dh = q.shape
        KV = k.shape[1]
        scores = q.reshape(B, KV, H // KV * T, Dh) @ k.transpose(-2, -1)  # (B, KV, g T, T)
        scores = scores.view(B, H, T, T)
        scores.add_(causal_mask(T, scores.dtype, scores.device))  # in place: matmul keeps no output
        probs = scores.softmax(dim=-1)
        y = (probs.view(B, KV, H // KV * T, T) @ v).view(B, H, T, Dh)
        return y.transpose(1, 2), probs


class SwiGLU(nn.Module):
    """``W_down (silu(W_gate x) * W_up x)`` (Shazeer 2020), gate and up stacked in one weight."""

    reference_ops = False  # plain PyTorch ops (see Attention)

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)  # rows: W_gate, W_up
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.down.in_features
        if not self.reference_ops and plain_cpu_fp32(x, self.gate_up.weight) and (
                fused_cpu.usable(x) or x.numel() // x.shape[-1] * hidden >= GATED_UP_MIN_ELEMENTS):
            return self.down(apply_function(GatedUpProjection, x, self.gate_up.weight))
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        return self.down(F.silu(gate) * up)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g`` (Zhang & Sennrich 2019).

    fp32 on CPU uses ``RMSNormFunction`` (own backward); other devices and dtypes ``F.rms_norm``.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    reference_ops = False  # plain PyTorch ops (see Attention)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.reference_ops and plain_cpu_fp32(x, self.weight):
            return apply_function(RMSNormFunction, x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Block(nn.Module):
    """One decoder layer: attention, then the FFN as K residual pre-norm SwiGLU sub-MLPs."""

    def __init__(self, arch: ArchConfig, layer: int, n_heads: int, rotary: RotaryTable) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(arch.d_model, arch.norm_eps)
        self.attn = Attention(arch.d_model, n_heads, rotary, arch.kv_per_layer()[layer])
        self.ffn_norms = nn.ModuleList(RMSNorm(arch.d_model, arch.norm_eps) for _ in range(arch.ffn.k))
        self.ffns = nn.ModuleList(SwiGLU(arch.d_model, arch.sub_mlp_hidden(layer, i)) for i in range(arch.ffn.k))

    def forward(self, x: torch.Tensor, observe: ProbabilityObserver | None = None) -> torch.Tensor:
        return self.feed_forward(x + self.attn(self.attn_norm(x), observe))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The K residual sub-MLPs: ``x + W_down,k (...)`` for k = 1..K."""
        for norm, ffn in zip(self.ffn_norms, self.ffns):
            x = x + ffn(norm(x))
        return x


LayerObserver = Callable[[int, int, torch.Tensor], None]  # observe(layer, r0, p): a ProbabilityObserver per layer


class Transformer(nn.Module):
    """Decoder-only LM for one ``ArchConfig``; ``forward(idx) -> logits (B, T, V)``.

    Initialisation (GPT-2 / Megatron "scaled init", generalised to K): every weight
    ``N(0, 0.02)``, norm gains 1, and the projections that write into the residual stream
    (W_O and every W_down) ``N(0, 0.02 / sqrt(L (1 + K)))``, since a model with ``L (1 + K)``
    residual branches adds that many terms to the stream; the variance at the output stays
    that of a single branch whatever the depth ``L`` or stack depth ``K``, which keeps
    deep hourglass stacks trainable at one learning rate.
    """

    def __init__(self, arch: ArchConfig) -> None:
        super().__init__()
        self.arch = arch
        self.embed = nn.Embedding(arch.vocab_size, arch.d_model)
        rotaries = {dim: RotaryTable(dim, arch.rope_theta) for dim in sorted(set(arch.head_dims()))}
        self.rotaries = nn.ModuleList(rotaries.values())  # shared per head dim, buffers only
        self.blocks = nn.ModuleList(Block(arch, layer, h, rotaries[arch.d_model // h])
                                    for layer, h in enumerate(arch.heads))
        self.norm = RMSNorm(arch.d_model, arch.norm_eps)
        self.lm_head = nn.Linear(arch.d_model, arch.vocab_size, bias=False)
        if arch.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

    def use_reference_ops(self, flag: bool = True) -> Transformer:
        """Plain PyTorch ops in every layer (no custom autograd functions, no C kernels): what ``torch.compile``
        traces and fuses. Same function, equal up to float rounding (tests check)."""
        for module in self.modules():
            if hasattr(type(module), "reference_ops"):
                module.reference_ops = flag
        return self

    def fill_rotary_tables(self, seq_len: int, dtype: torch.dtype) -> None:
        """Every RoPE table built now for ``seq_len`` positions in ``dtype`` (the attention's compute dtype: bf16
        under bf16 autocast), on the model's device. A table first grown inside a compiled forward is a buffer
        Dynamo guards on: the second call compiled the whole forward again (``runners.proxy.compile_model``)."""
        device = self.embed.weight.device
        for rotary in self.rotaries:
            rotary.table(seq_len, device, dtype)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        residual_std = INIT_STD / math.sqrt(self.arch.n_layers * (1 + self.arch.ffn.k))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith(("attn.out.weight", "down.weight")):
                p.normal_(0.0, residual_std)
            else:
                p.normal_(0.0, INIT_STD)

    def hidden(self, idx: torch.Tensor, observe: LayerObserver | None = None) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, D)
        for layer, block in enumerate(self.blocks):
            x = block(x, None if observe is None else functools.partial(observe, layer))
        return self.norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                observe: LayerObserver | None = None) -> torch.Tensor:
        """Logits (B, T, V); with ``targets`` (B, T), the mean next-token cross-entropy instead.

        ``observe(layer, r0, p)``, for analysis under ``torch.no_grad()``, is shown every layer's causal
        attention probabilities in query blocks (see ``ProbabilityObserver``) by the same kernels
        that train; e.g. ``runners.attention_distance.AttentionDistance``.
        """
        return self._head(self.hidden(idx, observe), targets)

    def _head(self, hidden: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        logits = self.lm_head(hidden)  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))

    @torch.no_grad()
    def analyse(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                reduce: Callable[[torch.Tensor], Any] | None = None) -> tuple[torch.Tensor, list[Any]]:
        """``forward`` with explicit attention: (logits, or the loss given ``targets``; per layer P (B, h_l, T, T)).

        One pass gives both the score and the attention maps (the proxy's final evaluation uses
        it on its first batches). Equal to ``forward`` up to float rounding. ``reduce`` maps each
        layer's P to what is kept (e.g. a float), so that only one layer's P is alive at a time.
        Slow path, analysis only.
        """
        kept = []
        x = self.embed(idx)  # (B, T, D)
        for block in self.blocks:
            attended, probs = block.attn.explicit(block.attn_norm(x))
            x = block.feed_forward(x + attended)
            kept.append(probs if reduce is None else reduce(probs))
        return self._head(self.norm(x), targets), kept

    def attention_probabilities(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the causal attention probabilities (B, h_l, T, T) on ``idx``. Slow path, analysis only."""
        return self.analyse(idx)[1]
