"""CPU causal attention behind ``nas.model.transformer``: own backward passes; forward alone in evaluation.

- ``BlockedCausalAttention``: exact causal attention by batched matmuls over query blocks (CPU, T <= 512);
  ``GroupedBlockedCausalAttention`` the same with each key/value head shared by a group of query heads;
- ``FusedCausalAttention``: the same, forward and backward each one C kernel call, at head dims 8 to 32;
- ``use_blocked_attention``, ``use_fused_attention``: where they beat SDPA's flash kernel (and fit in memory); the
  fused one where the CPU holds its 16-float vectors in registers (AVX-512: ``fused_attention_pays``).

The masked softmax runs as a one-pass C kernel on CPU in fp32 (``nas.model.fused_cpu``; PyTorch ops where no C
compiler is found). The q/k/v projections, the FFN and the norm are ``nas.model.kernels``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from nas.model import fused_cpu
from nas.model.kernels import _ForwardOnly

_CAUSAL_MASKS: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}


def causal_mask(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(n, n) additive mask: 0 on and below the diagonal, -inf above. Cached."""
    key = (n, dtype, device)
    if key not in _CAUSAL_MASKS:
        _CAUSAL_MASKS[key] = torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu(1)
    return _CAUSAL_MASKS[key]


QUERY_BLOCK = 64  # queries per block of BlockedCausalAttention (the best block on 2 cores for T = 32 ... 1024)


def _query_blocks(seq_len: int) -> list[tuple[int, int]]:
    """Row ranges [r0, r1) of the query blocks: ``round(T / 64)`` blocks (at least one) of equal size."""
    n_blocks = max(1, (seq_len + QUERY_BLOCK // 2) // QUERY_BLOCK)
    size = -(-seq_len // n_blocks)
    return [(r0, min(seq_len, r0 + size)) for r0 in range(0, seq_len, size)]


ProbabilityObserver = Callable[[int, torch.Tensor], None]
"""``observe(r0, p)``: one block of causal attention probabilities, queries ``r0 .. r0 + Tb`` over keys
``0 .. r0 + Tb``: p (N, Tb, r0 + Tb) with N = B h in batch-major order (``Attention.forward(observe=...)``)."""


def blocked_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               observe: ProbabilityObserver | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``BlockedCausalAttention``'s forward: (output (N, T, Dh), maybe a transposed view; P blocks)."""
    N, T, Dh = q.shape
    transposed = Dh <= TRANSPOSED_MAX_HEAD_DIM
    k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)  # (N, Dh, T) views
    out = q.new_empty(N, Dh, T) if transposed else q.new_empty(N, T, Dh)
    probs = []
    fused = fused_cpu.usable(q)
    for r0, r1 in _query_blocks(T):
        p = torch.bmm(q[:, r0:r1], k_t[:, :, :r1])  # (N, Tb, r1): scores of keys < r1
        if fused:  # one pass, masked keys skipped (fused_cpu.c)
            fused_cpu.causal_softmax_(p, r0)
        else:
            p[:, :, r0:].add_(causal_mask(r1 - r0, q.dtype, q.device))
            torch._softmax(p, -1, False, out=p)
        if observe is not None:
            observe(r0, p)
        if transposed:
            out[:, :, r0:r1] = torch.bmm(v_t[:, :, :r1], p.transpose(1, 2))  # (N, Dh, Tb) = (P V)^T
        else:
            out[:, r0:r1] = torch.bmm(p, v[:, :r1])  # (N, Tb, Dh)
        probs.append(p)
    return (out.transpose(1, 2) if transposed else out), probs


class BlockedCausalAttention(torch.autograd.Function):
    """Exact causal attention by batched matmuls over query blocks: CPU training at T <= 512.

    Inputs and output (N, T, Dh) with N = B H; q comes already multiplied by 1/sqrt(Dh)
    (``RotaryQKV``), so ``P = softmax(q k^T + causal mask)``. On CPU the cost at these lengths is
    the (T, T) score tensors and the narrow matmuls, not FLOPs, so:

    1. queries are cut into blocks of ~64 and block ``[r0, r1)`` only scores keys ``< r1``, which
       skips most of the masked upper triangle (``(n + 1) / 2n`` of the T x T scores with n blocks);
    2. softmax and its backward run in place on each block's scores;
    3. the 1/sqrt(Dh) scale was applied to Q (N T Dh values, inside the RoPE pass), not to the scores (N T^2);
    4. at Dh <= ``TRANSPOSED_MAX_HEAD_DIM`` every product that would be only Dh columns wide
       (P V, dV, dQ, dK) is computed transposed, (N, Dh, T), which MKL runs several times faster
       at Dh = 8 (the output is then a transposed view); wider heads compute them as they are,
       which is faster there. Measurements: benchmarks/RESULTS.md, "Design measurements".
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, probs = blocked_attention_forward(q, k, v)
        ctx.save_for_backward(q, k, v, *probs)
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, *probs = ctx.saved_tensors
        N, T, Dh = q.shape
        if Dh > TRANSPOSED_MAX_HEAD_DIM:
            return BlockedCausalAttention._backward(q, k, v, probs, d_out)
        d_out_t = d_out.transpose(1, 2)  # (N, Dh, T)
        k_t, v_t, q_t = k.transpose(1, 2), v.transpose(1, 2), q.transpose(1, 2)
        d_q_t = q.new_empty(N, Dh, T)
        d_k_t = d_v_t = None
        for (r0, r1), p in reversed(list(zip(_query_blocks(T), probs))):  # the last block spans every key
            d_o_t = d_out_t[:, :, r0:r1]  # (N, Dh, Tb)
            ds = torch.bmm(d_o_t.transpose(1, 2), v_t[:, :, :r1])  # (N, Tb, r1) = dO V^T
            torch._softmax_backward_data(ds, p, -1, p.dtype, grad_input=ds)
            d_q_t[:, :, r0:r1] = torch.bmm(k_t[:, :, :r1], ds.transpose(1, 2))  # (dS K)^T
            d_k = torch.bmm(q_t[:, :, r0:r1], ds)  # (N, Dh, r1) = (dS^T Q)^T
            d_v = torch.bmm(d_o_t, p)  # (N, Dh, r1) = (P^T dO)^T
            if d_k_t is None:
                d_k_t, d_v_t = d_k, d_v
            else:
                d_k_t[:, :, :r1] += d_k
                d_v_t[:, :, :r1] += d_v
        # (N, T, Dh) contiguous: the RoPE backward reads these in Dh-wide rows, ~3x slower from (N, Dh, T)
        return tuple(g.transpose(1, 2).contiguous() for g in (d_q_t, d_k_t, d_v_t))

    @staticmethod
    def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, probs: list[torch.Tensor],
                  d_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The backward with untransposed products (Dh > TRANSPOSED_MAX_HEAD_DIM); all (N, T, Dh)."""
        d_q = torch.empty_like(q)
        d_k = d_v = None
        for (r0, r1), p in reversed(list(zip(_query_blocks(q.shape[1]), probs))):
            d_o = d_out[:, r0:r1]  # (N, Tb, Dh)
            ds = torch.bmm(d_o, v[:, :r1].transpose(1, 2))  # (N, Tb, r1) = dO V^T
            torch._softmax_backward_data(ds, p, -1, p.dtype, grad_input=ds)
            d_q[:, r0:r1] = torch.bmm(ds, k[:, :r1])  # dS K
            d_k_block = torch.bmm(ds.transpose(1, 2), q[:, r0:r1])  # (N, r1, Dh) = dS^T Q
            d_v_block = torch.bmm(p.transpose(1, 2), d_o)  # (N, r1, Dh) = P^T dO
            if d_k is None:
                d_k, d_v = d_k_block, d_v_block
            else:
                d_k[:, :r1] += d_k_block
                d_v[:, :r1] += d_v_block
        return d_q, d_k, d_v


def grouped_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              observe: ProbabilityObserver | None = None
                              ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """``GroupedBlockedCausalAttention``'s forward: (output (N, g, T, Dh), maybe a permuted view; P blocks; q blocks).

    q (N, g, T, Dh): the g query heads of each key/value head (N = B KV); k, v (N, T, Dh). A block's queries of all
    g heads are gathered into one (N, g Tb, Dh) matrix (a copy of q's size, once per pass), so each product is one
    batched matmul over the group and the key/value heads are never repeated; its scores (N, g Tb, r1) are
    (N g, Tb, r1) blocks of ``BlockedCausalAttention``'s kind, so the causal softmax and the observer are its own.
    """
    N, g, T, Dh = q.shape
    transposed = Dh <= TRANSPOSED_MAX_HEAD_DIM
    k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)  # (N, Dh, T) views
    out = q.new_empty(N, Dh, g, T) if transposed else q.new_empty(N, g, T, Dh)
    probs, q_blocks = [], []
    fused = fused_cpu.usable(q)
    for r0, r1 in _query_blocks(T):
        Tb = r1 - r0
        q_block = q[:, :, r0:r1].reshape(N, g * Tb, Dh)  # rows: head 0's Tb queries, then head 1's, ...
        p = torch.bmm(q_block, k_t[:, :, :r1])  # (N, g Tb, r1)
        rows = p.view(N * g, Tb, r1)  # batch-major (b, kv, j): query head kv g + j, HF's repeat_kv order
        if fused:
            fused_cpu.causal_softmax_(rows, r0)
        else:
            rows[:, :, r0:].add_(causal_mask(Tb, q.dtype, q.device))
            torch._softmax(p, -1, False, out=p)
        if observe is not None:
            observe(r0, rows)
        if transposed:
            out[:, :, :, r0:r1] = torch.bmm(v_t[:, :, :r1], p.transpose(1, 2)).view(N, Dh, g, Tb)  # (P V)^T
        else:
            out[:, :, r0:r1] = torch.bmm(p, v[:, :r1]).view(N, g, Tb, Dh)
        probs.append(p)
        q_blocks.append(q_block)
    return (out.permute(0, 2, 3, 1) if transposed else out), probs, q_blocks


class GroupedBlockedCausalAttention(torch.autograd.Function):
    """``BlockedCausalAttention`` for grouped-query layers: q (N, g, T, Dh), k, v (N, T, Dh) -> (N, g, T, Dh).

    The same blocks, in-place softmax and transposed narrow products (module docstring of
    ``BlockedCausalAttention``); the g query heads of a key/value head share one batched matmul per
    block (``grouped_attention_forward``), and dK, dV sum over the group inside the matmul.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, probs, q_blocks = grouped_attention_forward(q, k, v)
        ctx.save_for_backward(k, v, *probs, *q_blocks)
        ctx.g = q.shape[1]
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        k, v, *saved = ctx.saved_tensors
        probs, q_blocks = saved[:len(saved) // 2], saved[len(saved) // 2:]
        N, T, Dh = k.shape
        g, transposed = ctx.g, Dh <= TRANSPOSED_MAX_HEAD_DIM
        k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)  # (N, Dh, T) views
        d_q = k.new_empty(N, Dh, g, T) if transposed else k.new_empty(N, g, T, Dh)
        d_k = d_v = None
        for (r0, r1), p, q_block in reversed(list(zip(_query_blocks(T), probs, q_blocks))):
            Tb = r1 - r0
            d_o = d_out[:, :, r0:r1].reshape(N, g * Tb, Dh)
            ds = torch.bmm(d_o, v_t[:, :, :r1])  # (N, g Tb, r1) = dO V^T
            torch._softmax_backward_data(ds, p, -1, p.dtype, grad_input=ds)
            if transposed:  # the Dh-wide products as (N, Dh, .)
                d_q[:, :, :, r0:r1] = torch.bmm(k_t[:, :, :r1], ds.transpose(1, 2)).view(N, Dh, g, Tb)  # (dS K)^T
                d_k_block = torch.bmm(q_block.transpose(1, 2), ds)  # (N, Dh, r1) = (dS^T Q)^T
                d_v_block = torch.bmm(d_o.transpose(1, 2), p)  # (N, Dh, r1) = (P^T dO)^T
            else:
                d_q[:, :, r0:r1] = torch.bmm(ds, k[:, :r1]).view(N, g, Tb, Dh)  # dS K
                d_k_block = torch.bmm(ds.transpose(1, 2), q_block)  # (N, r1, Dh) = dS^T Q
                d_v_block = torch.bmm(p.transpose(1, 2), d_o)  # (N, r1, Dh) = P^T dO
            if d_k is None:
                d_k, d_v = d_k_block, d_v_block
            elif transposed:
                d_k[:, :, :r1] += d_k_block
                d_v[:, :, :r1] += d_v_block
            else:
                d_k[:, :r1] += d_k_block
                d_v[:, :r1] += d_v_block
        if transposed:  # contiguous (N, ., T, Dh): the RoPE backward reads Dh-wide rows
            return d_q.permute(0, 2, 3, 1).contiguous(), d_k.transpose(1, 2).contiguous(), \
                d_v.transpose(1, 2).contiguous()
        return d_q, d_k, d_v


class FusedCausalAttention(torch.autograd.Function):
    """Exact causal attention, forward and backward, as one C kernel call each (``fused_cpu.c``,
    ``causal_attention_forward``): CPU, fp32, head dims in ``FUSED_ATTENTION_HEAD_DIMS``, multi-head or grouped.

    Input q (already times 1/sqrt(Dh)) (B, H, T, Dh), k, v (B, KV, T, Dh) contiguous, query head h reading key/value
    head h // (H / KV) (HF's ``repeat_kv`` order; KV = H is multi-head); output (B, T, H, Dh), the layout the output
    projection reads, so no copy follows. ``P = softmax(q k^T + causal mask)`` is computed for keys ``j <= i`` only;
    the backward keeps each row's max ``m_i`` and ``1 / l_i`` (2 N T floats, N = B H) and recomputes
    ``P_ij = exp(S_ij - m_i) / l_i`` (FlashAttention's recomputation: cheaper on a CPU than writing P out and
    reading it back), then
    ``dS = P (dO V^T - rowsum(dO * O))``, ``dQ = dS K``, ``dK = dS^T Q``, ``dV = P^T dO``. At head dims of 8 to 32
    this replaces batched matmuls with an inner dimension of Dh, the softmax and the layout copies of
    ``BlockedCausalAttention`` (measurements: benchmarks/RESULTS.md, "Design measurements").
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the kernel reads raw memory (no copy: they are)
        out, stats = fused_cpu.causal_attention_forward(q, k, v, keep_stats=not isinstance(ctx, _ForwardOnly))
        if stats is not None:
            ctx.save_for_backward(q, k, v, stats, out)  # out: the output projection keeps it anyway
        return out

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, stats, out = ctx.saved_tensors
        return fused_cpu.causal_attention_backward(d_out.contiguous(), out, q, k, v, stats)


TRANSPOSED_MAX_HEAD_DIM = 8  # BlockedCausalAttention computes Dh-wide products transposed up to this head dim
BLOCKED_ATTENTION_MAX_T = 512  # CPU: BlockedCausalAttention up to this context, SDPA's flash kernel beyond
BLOCKED_ATTENTION_MAX_BYTES = 512 * 2 ** 20  # ... and while one layer's saved scores stay under this


# FusedCausalAttention's head dims, one layer against BlockedCausalAttention on one thread (two), an AVX-512 CPU:
# 2.3x (2.8x) at 8, 1.9x (2.1x) at 12, 1.5x (1.8x) at 16, 1.1x (1.4x) at 24, 1.0x (1.3x) at 32
# (benchmarks/fused_attention.py); wider heads run the blocked products well, and a kernel's Dh registers of output
# sums would no longer fit
FUSED_ATTENTION_HEAD_DIMS = (8, 12, 16, 24, 32)
# None: the fused attention only where it pays (``fused_attention_pays``); True or False: on or off wherever it can
# run (benchmarks measure it on machines where it is off by default)
FUSED_ATTENTION_FORCED: bool | None = None


@functools.cache
def fused_attention_pays() -> bool:
    """Whether this CPU runs ``FusedCausalAttention`` faster than ``BlockedCausalAttention``: where its 16-float
    vectors are one register each (AVX-512). With 8-float registers (AVX2) every vector is two and its 16x16 tile
    transposes spill: one layer measured 0.19-0.63x the blocked path and a ``cpu`` step 0.69-0.79x on a 2-core AMD
    EPYC (AVX2, fp32 matmul peak read 91-180 GFLOP/s), against 1.0-2.3x and 1.12-1.38x on an AVX-512 Xeon (peak 447)
    (``python -m benchmarks.fused_attention``; benchmarks/RESULTS.md, "Design measurements")."""
    lib = fused_cpu.library()
    return lib is not None and bool(lib.attention_vectors_in_registers())


def use_fused_attention(q: torch.Tensor) -> bool:
    """Whether attention on q (B, H, T, Dh), grouped or not, takes ``FusedCausalAttention``: CPU fp32 with the
    kernels built, a head dim it has a kernel for, a CPU where it pays (or ``FUSED_ATTENTION_FORCED``), and a call
    within ``use_blocked_attention``'s bounds: where it was measured against SDPA's flash kernel. (It keeps no
    probabilities itself, 2 N T floats of row statistics, so its own memory would allow more.)"""
    B, H, T, Dh = q.shape
    wanted = fused_attention_pays() if FUSED_ATTENTION_FORCED is None else FUSED_ATTENTION_FORCED
    return (Dh in FUSED_ATTENTION_HEAD_DIMS and wanted
            and use_blocked_attention(q.device, B * H, T, q.element_size()) and fused_cpu.usable(q))


def use_blocked_attention(device: torch.device, n_heads_total: int, seq_len: int, element_size: int) -> bool:
    """Whether a CPU attention call over ``n_heads_total = B H`` heads takes ``BlockedCausalAttention``.

    On 2 cores it is faster than SDPA's flash kernel, forward + backward, for every head dim up to
    T = 512 and no faster at T = 1024 (benchmarks/RESULTS.md, "Design measurements"). It keeps
    ``~0.6 N T^2`` scores per layer for the backward (flash keeps O(N T)), hence the memory bound.
    """
    saved = n_heads_total * seq_len * seq_len * element_size * 0.6
    return device.type == "cpu" and seq_len <= BLOCKED_ATTENTION_MAX_T and saved <= BLOCKED_ATTENTION_MAX_BYTES
