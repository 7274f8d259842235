"""CPU autograd functions behind ``nas.model.transformer``: own backward passes; forward alone in evaluation.

- ``RotaryQKV``: the fused q/k/v projection split into heads, RoPE applied to q and k, q pre-scaled by 1/sqrt(Dh);
  ``RotaryGroupedQKV`` the same for grouped-query layers (fewer key/value heads than query heads);
- ``GatedUpProjection``: ``silu(x W_gate^T) * (x W_up^T)`` from the stacked weight;
- ``RMSNormFunction``: RMSNorm in four passes forward and backward.

On CPU in fp32 their elementwise parts run as one-pass C kernels (``nas.model.fused_cpu``, built on
first use; PyTorch ops where no C compiler is found). Every path matches HF ``LlamaForCausalLM`` within
float rounding (``tests/test_model.py`` checks logits and gradients, ``gradcheck`` the backward passes).
The attention itself is ``nas.model.attention_kernels``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nas.model import fused_cpu


def rotate_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> None:
    """``out = R(sign * theta) x`` over the last dim (HF ``rotate_half`` pairing); ``x`` may be any strided view.

    ``sign=1`` is RoPE, ``sign=-1`` its inverse (= its transpose, which is the backward). Four
    fused multiply-adds on halves, no temporaries; channels beyond ``2 * cos.shape[-1]`` are copied.
    """
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    o1, o2 = out[..., :half], out[..., half:2 * half]
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-sign)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin, value=sign)  # x2 cos + x1 sin
    if 2 * half < x.shape[-1]:
        out[..., 2 * half:].copy_(x[..., 2 * half:])


class _ForwardOnly:
    """The ``ctx`` of a forward run outside autograd: attributes are kept, nothing is saved."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        """Keeps nothing: no backward will run."""


def apply_function(function: type[torch.autograd.Function], *args: Any) -> Any:
    """``function.apply(*args)``; without grad mode (evaluation), its forward alone, skipping the autograd node.

    An evaluation forward then builds no autograd nodes at all (one per layer and kernel otherwise).
    """
    if torch.is_grad_enabled():
        return function.apply(*args)
    return function.forward(_ForwardOnly(), *args)


class RotaryQKV(torch.autograd.Function):
    """Fused qkv (B, T, 3d) -> q, k rotated and v, each contiguous (B, H, T, Dh), as one autograd node.

    q also comes out multiplied by ``q_scale`` (the attention's 1/sqrt(Dh)): in the fused kernel
    that is free, and the attention then makes no pass over q (nor over dq in the backward). The
    backward rotates dq, dk back and writes dq, dk, dv straight into one (B, T, 3d) gradient,
    instead of autograd's zero-filled slice gradients summed together.
    """

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, q_scale: float):
        B, T, three_d = qkv.shape
        head_dim = three_d // (3 * n_heads)
        ctx.fused = fused_cpu.usable(qkv, cos, sin) and qkv.is_contiguous()
        if ctx.fused:  # one pass (fused_cpu.c): 3x faster than the strided ops below at B16 T256 Dh32
            cos, sin = cos.contiguous(), sin.contiguous()
            out = fused_cpu.rope_qkv_forward(qkv, cos, sin, n_heads, q_scale)
        else:
            src = qkv.view(B, T, 3, n_heads, head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh) view
            out = qkv.new_empty(3, B, n_heads, T, head_dim)
            rotate_into(out[:2], src[:2], cos, sin, 1.0)
            out[0].mul_(q_scale)
            out[2].copy_(src[2])
        ctx.save_for_backward(cos, sin)
        ctx.n_heads, ctx.q_scale = n_heads, q_scale
        return out[0], out[1], out[2]

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        B, H, T, Dh = next(g for g in (dq, dk, dv) if g is not None).shape
        if ctx.fused:
            dq, dk, dv = (g.contiguous() if g is not None else cos.new_zeros(B, H, T, Dh) for g in (dq, dk, dv))
            return fused_cpu.rope_qkv_backward(dq, dk, dv, cos, sin, ctx.q_scale), None, None, None, None
        grad = dq.new_empty(B, T, 3, H, Dh) if dq is not None else dk.new_empty(B, T, 3, H, Dh)
        dst = grad.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh) view
        for i, g in enumerate((dq, dk)):
            if g is None:
                dst[i].zero_()
            else:
                rotate_into(dst[i], g, cos, sin, -1.0)
        dst[0].mul_(ctx.q_scale)
        if dv is None:
            dst[2].zero_()
        else:
            dst[2].copy_(dv)
        return grad.view(B, T, 3 * H * Dh), None, None, None, None


class RotaryGroupedQKV(torch.autograd.Function):
    """``RotaryQKV`` for a grouped-query layer: qkv (B, T, (H + 2 KV) Dh) -> q (B, H, T, Dh), k, v (B, KV, T, Dh).

    The projection's rows are W_Q (H Dh), W_K (KV Dh), W_V (KV Dh); the fused kernel is
    ``rope_qkv_grouped_forward`` (multi-head layers keep ``RotaryQKV`` and its kernel unchanged).
    """

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv: int,
                q_scale: float):
        B, T, width = qkv.shape
        head_dim = width // (n_heads + 2 * n_kv)
        ctx.fused = fused_cpu.usable(qkv, cos, sin) and qkv.is_contiguous()
        if ctx.fused:
            cos, sin = cos.contiguous(), sin.contiguous()
            q, k, v = fused_cpu.rope_qkv_grouped_forward(qkv, cos, sin, n_heads, n_kv, q_scale)
        else:
            src_q, src_k, src_v = (part.unflatten(-1, (-1, head_dim)).transpose(1, 2)  # (B, heads, T, Dh) views
                                   for part in qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], -1))
            q, k = qkv.new_empty(B, n_heads, T, head_dim), qkv.new_empty(B, n_kv, T, head_dim)
            rotate_into(q, src_q, cos, sin, 1.0)
            q.mul_(q_scale)
            rotate_into(k, src_k, cos, sin, 1.0)
            v = src_v.contiguous()
        ctx.save_for_backward(cos, sin)
        ctx.shape, ctx.q_scale = (B, T, n_heads, n_kv, head_dim), q_scale
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        B, T, H, KV, Dh = ctx.shape
        dq = dq.contiguous() if dq is not None else cos.new_zeros(B, H, T, Dh)
        dk, dv = (g.contiguous() if g is not None else cos.new_zeros(B, KV, T, Dh) for g in (dk, dv))
        if ctx.fused:
            return fused_cpu.rope_qkv_grouped_backward(dq, dk, dv, cos, sin, ctx.q_scale), None, None, None, None, None
        grad = dq.new_empty(B, T, (H + 2 * KV) * Dh)
        dst_q, dst_k, dst_v = (part.unflatten(-1, (-1, Dh)).transpose(1, 2)
                               for part in grad.split([H * Dh, KV * Dh, KV * Dh], -1))
        rotate_into(dst_q, dq, cos, sin, -1.0)
        dst_q.mul_(ctx.q_scale)
        rotate_into(dst_k, dk, cos, sin, -1.0)
        dst_v.copy_(dv)
        return grad, None, None, None, None, None


class GatedUpProjection(torch.autograd.Function):
    """``silu(x W_gate^T) * (x W_up^T)`` from the stacked weight ``[W_gate; W_up]`` (2F, d), one autograd node.

    Backward (``g = x W_gate^T``, ``u = x W_up^T``, ``dh`` the output gradient)::

        dg = silu'(g) (dh u)     du = silu(g) dh
        dW_gate = dg^T x         dW_up = du^T x      (written into the two halves of one (2F, d) buffer)
        dx = dg W_gate + du W_up

    Autograd through the fused ``d -> 2F`` matmul, ``chunk`` and the product instead
    concatenates ``dg`` and ``du`` into a (N, 2F) gradient (a 22 MB copy per layer at d256,
    B16 T256) and keeps ``silu(g)`` alive for the backward. Faster per FFN from d256 up, slower at
    d96 without the fused kernels (two half-width matmuls cost more there), hence
    ``GATED_UP_MIN_ELEMENTS`` (benchmarks/RESULTS.md, "Design measurements").
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        hidden = weight.shape[0] // 2
        x2 = x.reshape(-1, x.shape[-1])  # (N, d)
        gate, up = x2 @ weight[:hidden].t(), x2 @ weight[hidden:].t()  # (N, F) each
        ctx.save_for_backward(x, weight, gate, up)
        ctx.fused = fused_cpu.usable(gate)
        h = fused_cpu.swiglu_forward(gate, up) if ctx.fused else F.silu(gate).mul_(up)  # (N, F)
        return h.view(*x.shape[:-1], hidden)

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        x, weight, gate, up = ctx.saved_tensors
        hidden = weight.shape[0] // 2
        x2, dh = x.reshape(-1, x.shape[-1]), dh.reshape(-1, hidden)  # (N, d), (N, F)
        if ctx.fused:  # one pass instead of five (fused_cpu.c)
            d_gate, d_up = fused_cpu.swiglu_backward(dh.contiguous(), gate, up)
        else:
            d_gate = torch.mul(dh, up)
            torch.ops.aten.silu_backward.grad_input(d_gate, gate, grad_input=d_gate)  # silu'(g) (dh u), in place
            d_up = F.silu(gate).mul_(dh)
        d_weight = None
        if ctx.needs_input_grad[1]:
            d_weight = torch.empty_like(weight)
            torch.mm(d_gate.t(), x2, out=d_weight[:hidden])
            torch.mm(d_up.t(), x2, out=d_weight[hidden:])
        d_x = torch.mm(d_gate, weight[:hidden]).addmm_(d_up, weight[hidden:]) if ctx.needs_input_grad[0] else None
        return (d_x.view_as(x) if d_x is not None else None), d_weight


# CPU fp32 without the fused kernels: tokens x hidden from which GatedUpProjection is faster (d >= 128);
# with them it is faster at every measured size
GATED_UP_MIN_ELEMENTS = 2 ** 20


def plain_cpu_fp32(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """CPU, fp32 input and weight, no autocast: where the hand-written backward passes are used."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu"))


class RMSNormFunction(torch.autograd.Function):
    """``y = x r g`` with ``r = (mean(x^2) + eps)^(-1/2)`` per row, in four passes forward and backward.

    Backward (``D`` = row width, ``t = dy * x``): ``dg = sum_rows(t) r`` (a matrix-vector product),
    ``dx = r (dy g) - x r^3 (t . g) / D``. Autograd through ``F.rms_norm``'s CPU decomposition
    takes ~13 elementwise passes; this takes 6 (benchmarks/RESULTS.md, "Design measurements").
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        D = x.shape[-1]
        ctx.fused = fused_cpu.usable(x, weight) and x.is_contiguous() and weight.is_contiguous()
        if ctx.fused:  # one pass forward, one backward (fused_cpu.c)
            y, rstd = fused_cpu.rmsnorm_forward(x, weight, eps)  # rstd (...)
            ctx.save_for_backward(x, weight, rstd)
            return y
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (..., 1), one fused pass
        rstd = norm.square_().div_(D).add_(eps).rsqrt_()  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return torch.mul(x, rstd).mul_(weight)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        D = x.shape[-1]
        if ctx.fused:
            dx, d_weight = fused_cpu.rmsnorm_backward(dy.contiguous(), x, weight, rstd)
            return dx, d_weight if ctx.needs_input_grad[1] else None, None
        x2, dy2, r = x.reshape(-1, D), dy.reshape(-1, D), rstd.reshape(-1)  # (N, D), (N, D), (N,)
        t = dy2 * x2  # (N, D)
        d_weight = t.t() @ r if ctx.needs_input_grad[1] else None  # (D,)
        coef = (t @ weight).mul_(r.pow(3)).div_(D).unsqueeze(1)  # (N, 1): r^3 (t . g) / D
        dx = torch.mul(dy2, weight).mul_(r.unsqueeze(1)).addcmul_(x2, coef, value=-1.0)  # (N, D)
        return dx.view_as(x), d_weight, None
