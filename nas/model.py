"""The decoder built from an ``ArchConfig``: LLaMA blocks with per-layer head counts and a K-deep SwiGLU stack.

Per layer ``l`` (pre-norm residual, Touvron et al. 2023)::

    x = x + W_O · SDPA(RoPE(W_Q n), RoPE(W_K n), W_V n)      n = RMSNorm(x), h_l heads of d/h_l
    for k in 1..K:  x = x + W_down,k (silu(W_gate,k m) * W_up,k m)    m = RMSNorm_k(x)

With uniform heads and ``K = 1`` this is exactly HF ``LlamaForCausalLM`` (same RoPE
``rotate_half`` convention, same RMSNorm), so weights map one to one (tests check logits).

The forward path has no per-head Python loop: a layer's head count only changes a
``view``, so a Prism schedule costs what the uniform one costs. Fusions: W_Q, W_K, W_V are
one ``d -> 3d`` matmul; gate and up are one ``d -> 2 d_h`` matmul; RoPE rotates Q and K
in one op from a cached table per head dim; RMSNorm is ``F.rms_norm``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import ArchConfig

INIT_STD = 0.02  # GPT-2 / LLaMA reference initialisation


class RotaryTable(nn.Module):
    """cos/sin tables for one head dim, grown on demand: ``theta_i = base^(-2i/dim)`` (Su et al. 2021, RoFormer).

    Layout follows HF LLaMA: the table is ``cat(freqs, freqs)`` and the rotation is
    ``x * cos + rotate_half(x) * sin``. An odd head dim rotates its first ``dim - 1`` channels.
    """

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.rot_dim = head_dim - head_dim % 2
        self.base = base
        self.register_buffer("cos", torch.empty(0, self.rot_dim), persistent=False)
        self.register_buffer("sin", torch.empty(0, self.rot_dim), persistent=False)

    def table(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos.shape[0] < seq_len or self.cos.device != device or self.cos.dtype != dtype:
            length = max(seq_len, self.cos.shape[0])
            inv_freq = 1.0 / (self.base ** (torch.arange(0, self.rot_dim, 2, device=device, dtype=torch.float32) / self.rot_dim))
            freqs = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)  # (T, rot/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (T, rot)
            self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        return self.cos[:seq_len], self.sin[:seq_len]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape (B, T, H, D) by tables (T, R), R <= D, R even."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, R): broadcast over heads
    if rot == x.shape[-1]:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((apply_rotary(head, cos[:, 0], sin[:, 0]), tail), dim=-1)


class Attention(nn.Module):
    """Causal multi-head attention with this layer's own head count; parameters independent of it."""

    def __init__(self, d_model: int, n_heads: int, rotary: RotaryTable) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)  # rows: W_Q, W_K, W_V
        self.out = nn.Linear(d_model, d_model, bias=False)  # W_O
        self.rotary = rotary

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)  # (B, T, 3, H, Dh)
        cos, sin = self.rotary.table(T, x.device, x.dtype)
        qk = apply_rotary(qkv[:, :, :2].reshape(B, T, 2 * self.n_heads, self.head_dim), cos, sin)  # (B, T, 2H, Dh)
        q, k = qk.view(B, T, 2, self.n_heads, self.head_dim).transpose(1, 3).unbind(2)  # (B, H, T, Dh) each
        v = qkv[:, :, 2].transpose(1, 2)  # (B, H, T, Dh)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self._qkv(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(B, T, D))

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit causal softmax(QK^T / sqrt(Dh)), shape (B, H, T, T). Analysis only: O(T^2) memory."""
        q, k, _ = self._qkv(x)
        T = x.shape[1]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(dim=-1)


class SwiGLU(nn.Module):
    """``W_down (silu(W_gate x) * W_up x)`` (Shazeer 2020), gate and up fused in one matmul."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)  # rows: W_gate, W_up
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        return self.down(F.silu(gate) * up)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g`` (Zhang & Sennrich 2019), via the fused ``F.rms_norm``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Block(nn.Module):
    """One decoder layer: attention, then the FFN as K residual pre-norm SwiGLU sub-MLPs."""

    def __init__(self, arch: ArchConfig, n_heads: int, rotary: RotaryTable) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(arch.d_model, arch.norm_eps)
        self.attn = Attention(arch.d_model, n_heads, rotary)
        self.ffn_norms = nn.ModuleList(RMSNorm(arch.d_model, arch.norm_eps) for _ in range(arch.ffn.k))
        self.ffns = nn.ModuleList(SwiGLU(arch.d_model, arch.ffn.hidden) for _ in range(arch.ffn.k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        for norm, ffn in zip(self.ffn_norms, self.ffns):
            x = x + ffn(norm(x))
        return x


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
        self.blocks = nn.ModuleList(Block(arch, h, rotaries[arch.d_model // h]) for h in arch.heads)
        self.norm = RMSNorm(arch.d_model, arch.norm_eps)
        self.lm_head = nn.Linear(arch.d_model, arch.vocab_size, bias=False)
        if arch.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.reset_parameters()

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

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V); with ``targets`` (B, T), the mean next-token cross-entropy instead."""
        logits = self.lm_head(self.hidden(idx))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))

    @torch.no_grad()
    def attention_probabilities(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the causal attention probabilities (B, h_l, T, T) on ``idx``. Slow path, analysis only."""
        probs = []
        x = self.embed(idx)
        for block in self.blocks:
            probs.append(block.attn.probabilities(block.attn_norm(x)))
            x = block(x)
        return probs
