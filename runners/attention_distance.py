"""Per-layer mean attention distance ``D_l`` (the Prism paper's mechanistic measure).

``D_l = mean over heads h, queries i of  sum_j p^l_{h,i,j} |i - j|``: the attention-weighted
distance between a query and the keys it reads, averaged over heads and query positions
(causal, so ``j <= i``). Small ``D_l`` means local attention; large means global integration.
"""

from __future__ import annotations

import torch

from nas.model import Transformer


def mean_attention_distance(probs: torch.Tensor) -> float:
    """``probs`` (B, H, T, T), rows summing to 1 -> the scalar ``D`` for that layer.

    ``D = sum_ij S_ij |i - j| / (B H T)`` with ``S = sum over batch and heads of P``: one pass over P.
    """
    B, H, T, _ = probs.shape
    pos = torch.arange(T, device=probs.device, dtype=torch.float32)
    distance = (pos[:, None] - pos[None, :]).abs()  # (T, T): |i - j|
    summed = probs.sum(dim=(0, 1), dtype=torch.float32)  # (T, T): one pass over P, then (T, T) work
    return float((summed * distance).sum() / (B * H * T))


@torch.no_grad()
def layer_attention_distances(model: Transformer, batches: list[torch.Tensor]) -> list[float]:
    """``D_l`` for every layer, averaged over ``batches`` of token ids (B, T)."""
    totals = [0.0] * len(model.blocks)
    for idx in batches:
        for layer, distance in enumerate(model.analyse(idx, reduce=mean_attention_distance)[1]):
            totals[layer] += distance
    return [t / max(1, len(batches)) for t in totals]
