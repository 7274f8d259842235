"""Per-layer mean attention distance ``D_l`` (the Prism paper's mechanistic measure).

``D_l = mean over heads h, queries i of  sum_j p^l_{h,i,j} |i - j|``: the attention-weighted
distance between a query and the keys it reads, averaged over heads and query positions
(causal, so ``j <= i``). Small ``D_l`` means local attention; large means global integration.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nas.model.transformer import Transformer


def mean_attention_distance(probs: torch.Tensor) -> float:
    """``probs`` (B, H, T, T), rows summing to 1 -> the scalar ``D`` for that layer.

    ``D = sum_ij S_ij |i - j| / (B H T)`` with ``S = sum over batch and heads of P``: one pass over P.
    """
    B, H, T, _ = probs.shape
    pos = torch.arange(T, device=probs.device, dtype=torch.float32)
    distance = (pos[:, None] - pos[None, :]).abs()  # (T, T): |i - j|
    summed = probs.sum(dim=(0, 1), dtype=torch.float32)  # (T, T): one pass over P, then (T, T) work
    return float((summed * distance).sum() / (B * H * T))


class AttentionDistance:
    """``D_l`` of every layer, gathered during an ordinary forward: ``model(idx, y, observe=AttentionDistance(...))``.

    The model shows each layer's probabilities block by block (queries ``r0 .. r0 + Tb`` over keys
    ``< r0 + Tb``, the blocked kernel's own blocks), so no (B, H, T, T) tensor is built. Only the
    first ``rows`` sequences of the batch count: one forward can score more batches than it
    analyses. Per block, ``sum_ij S_ij |r0 + i - j|`` with ``S`` the block summed over those
    sequences and heads; ``D_l`` = that total / (rows h_l T), as in ``mean_attention_distance``.
    """

    def __init__(self, heads: Sequence[int], rows: int, seq_len: int) -> None:
        self.heads, self.rows, self.seq_len = tuple(heads), rows, seq_len
        self._totals: list[torch.Tensor | float] = [0.0] * len(self.heads)

    def __call__(self, layer: int, r0: int, probs: torch.Tensor) -> None:
        summed = probs[: self.rows * self.heads[layer]].sum(dim=0, dtype=torch.float32)  # (Tb, r1)
        rows, cols = summed.shape
        query = torch.arange(r0, r0 + rows, device=summed.device, dtype=torch.float32)
        key = torch.arange(cols, device=summed.device, dtype=torch.float32)
        self._totals[layer] = self._totals[layer] + (summed * (query[:, None] - key[None, :]).abs()).sum()

    def distances(self) -> list[float]:
        """``D_l`` per layer (a float each; one device sync for all layers)."""
        totals = torch.stack([torch.as_tensor(t, dtype=torch.float32).cpu() for t in self._totals])
        return [float(t) / (self.rows * h * self.seq_len) for t, h in zip(totals, self.heads)]


@torch.no_grad()
def layer_attention_distances(model: Transformer, batches: list[torch.Tensor]) -> list[float]:
    """``D_l`` for every layer, averaged over ``batches`` of token ids (B, T)."""
    totals = [0.0] * len(model.blocks)
    for idx in batches:
        for layer, distance in enumerate(model.analyse(idx, reduce=mean_attention_distance)[1]):
            totals[layer] += distance
    return [t / max(1, len(batches)) for t in totals]
