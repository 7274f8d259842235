"""Budget matching for Hourglass shapes: the exact parameter count of a grid point, solved for ``d_model``.

A member has ``K`` SwiGLU sub-MLPs ``d_model -> d_h -> d_model`` per layer, ``d_model / head_dim``
heads in every layer, and the exact parameter count of ``nas.arch.ArchConfig.n_params``

    N(L, d, K, d_h, w) = t V d + 4 L d^2 + 3 d (L K d_h + w) + L (1 + K) d + d     (t = 1 tied, 2 untied)

within ``tolerance`` (relative) of the budget ``B``, where ``w`` of the ``L K`` sub-MLPs take
``d_h + 1`` (``FFNShape.wider``): the budget is matched in steps of ``3 d`` parameters, not
``3 L K d``, so every grid point whose width allows it lands within 0.01 % (at ``--budget 20M
--vocab 256 --fix attention`` all of K = 1 ... 8 do; with ``d_h`` alone, only K = 1, 2, 8 came
within 0.1 %). ``hidden_multiple`` (e.g. 64 for GPU presets, whose matmuls want tile-aligned
widths) instead rounds ``d_h`` to that multiple with no wider sub-MLPs: aligned kernels, but the
budget steps are ``3 L K d hidden_multiple`` (about 1-5 % at GPT-2 scale), so raise ``tolerance``.

Solver for a grid point ``(K, L, rho = d_h / d_model)``: with ``d_h = rho d`` the count is a quadratic
``a d^2 + b d`` (``a = L (4 + 3 K rho)``, ``b = t V + L (1 + K) + 1``), so the continuous width is
``d*(rho) = (-b + sqrt(b^2 + 4 a B)) / 2a``. The candidates are the multiples of ``head_dim``
between ``d*(rho (1 + ratio_tolerance))`` and ``d*(rho (1 - ratio_tolerance))``; each gets the FFN
closest to the budget, ``u = round((B - N(L, d, K, 0, 0)) / 3 d)`` hidden units over all sub-MLPs,
``d_h = u // (L K)`` and ``w = u % (L K)``. Among those within
``tolerance`` of the budget and within ``ratio_tolerance`` of ``rho``, the one closest to ``rho``
wins. A point with no such width is *unmatched* and reported with the reason.

Grouped-query attention (``kv_group = g > 1``, ``search_spaces.kv``): every layer keeps ``h / g`` key/value
heads, so W_K and W_V are ``d / g x d`` and the attention's ``4 L d^2`` becomes ``2 (1 + 1/g) L d^2``
(``a = L (2 + 2/g + 3 K rho)``); widths are multiples of ``g head_dim`` (the head count divisible by g)
and at least ``g head_dim min_kv_heads``. The parameters the smaller projections save go where the grid
point puts them: width (d solved), depth (the point's L) or the FFN (d_h, and K). ``rebalance_ffn`` gives
one shape's saved parameters to its FFN hidden size instead (its width and depth fixed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nas.arch import ArchConfig, FFNShape, uniform


@dataclass(frozen=True)
class BudgetMatcher:
    """Shapes of one vocabulary, embedding tying and head dim, matched to ``budget`` within ``tolerance``."""

    budget: int
    vocab_size: int
    tie_embeddings: bool
    head_dim: int
    tolerance: float
    hidden_multiple: int = 1  # d_h a multiple of this and no wider sub-MLPs; 1: exact
    kv_group: int = 1  # query heads per key/value head in every layer (1: multi-head attention)
    min_kv_heads: int = 1  # a grouped shape keeps at least this many key/value heads per layer

    def arch(self, layers: int, d_model: int, k: int, d_h: int, wider: int = 0) -> ArchConfig:
        heads = d_model // self.head_dim
        shape = uniform(layers, d_model, heads, self.vocab_size, FFNShape(k, d_h, wider), self.tie_embeddings)
        return shape.replace(kv_heads=[heads // self.kv_group] * layers) if self.kv_group > 1 else shape

    @property
    def width_step(self) -> int:
        """Widths are multiples of this: the head dim, times the group size (the head count divides into groups)."""
        return self.head_dim * self.kv_group

    def width_error(self, d_model: int) -> str | None:
        """Why ``d_model`` has no head count this matcher's group size takes; None when it has."""
        heads = d_model // self.head_dim
        if self.kv_group > 1 and heads % self.kv_group:
            return f"d_model={d_model} has {heads} heads, not a multiple of the group size {self.kv_group}"
        if self.kv_group > 1 and heads // self.kv_group < self.min_kv_heads:
            return (f"d_model={d_model} has {heads} heads: {heads // self.kv_group} key/value heads in groups of "
                    f"{self.kv_group}, fewer than min_kv_heads={self.min_kv_heads}")
        return None

    def deviation(self, arch: ArchConfig) -> float:
        """Signed relative distance of the exact parameter count from the budget."""
        return (arch.n_params()["total"] - self.budget) / self.budget

    def best_ffn(self, layers: int, d_model: int, k: int) -> tuple[int, int] | None:
        """``(d_h, wider)`` whose exact count is closest to the budget (module docstring), or None if no FFN fits."""
        rest = self.arch(layers, d_model, k, 1).n_params()["total"] - 3 * layers * k * d_model
        if self.hidden_multiple > 1:  # aligned: whole multiples of the sub-MLP width, no wider ones
            step = 3 * layers * k * d_model * self.hidden_multiple
            d_h = (2 * (self.budget - rest) + step) // (2 * step) * self.hidden_multiple
            return (d_h, 0) if d_h >= 1 else None
        step = 3 * d_model  # parameters per hidden unit of one sub-MLP
        units = (2 * (self.budget - rest) + step) // (2 * step)  # round to nearest
        d_h, wider = divmod(units, layers * k)
        return (d_h, wider) if d_h >= 1 else None

    def width(self, layers: int, k: int, ratio: float) -> float:
        """The continuous d_model at which d_h = ratio * d_model meets the budget (module docstring)."""
        a = layers * (2 + 2 / self.kv_group + 3 * k * ratio)
        b = (1 if self.tie_embeddings else 2) * self.vocab_size + layers * (1 + k) + 1
        return (-b + math.sqrt(b * b + 4 * a * self.budget)) / (2 * a)

    def solve(self, k: int, layers: int, ratio: float, ratio_tolerance: float) -> ArchConfig | str:
        """The member for one grid point, or the reason there is none."""
        hd = self.width_step
        smallest = hd * (self.min_kv_heads if self.kv_group > 1 else 1)
        low = max(smallest, math.floor(self.width(layers, k, ratio * (1 + ratio_tolerance)) / hd) * hd)
        high = math.ceil(self.width(layers, k, ratio * (1 - ratio_tolerance)) / hd) * hd
        best: tuple[tuple[float, float], ArchConfig] | None = None
        miss: tuple[float, ArchConfig] | None = None
        for d_model in range(low, high + 1, hd):
            ffn = self.best_ffn(layers, d_model, k)
            if ffn is None or abs(ffn[0] / d_model / ratio - 1) > ratio_tolerance:
                continue
            d_h = ffn[0]
            arch = self.arch(layers, d_model, k, *ffn)
            deviation = abs(self.deviation(arch))
            if deviation <= self.tolerance:
                score = (abs(d_h / d_model - ratio), deviation)
                if best is None or score < best[0]:
                    best = (score, arch)
            elif miss is None or deviation < miss[0]:
                miss = (deviation, arch)
        if best:
            return best[1]
        if miss:
            d, d_h = miss[1].d_model, miss[1].ffn.hidden
            step = 3 * d * (layers * k * self.hidden_multiple if self.hidden_multiple > 1 else 1)
            return (f"budget steps of {step:,} parameters are too coarse: the closest, d_model={d} d_h={d_h}, is "
                    f"{self.deviation(miss[1]):+.3%} off the budget (tolerance ±{self.tolerance:.3%}; raise "
                    "--tolerance)")
        multiple = f"head_dim={hd}" if self.kv_group == 1 else f"{hd} (head_dim x group size {self.kv_group})"
        return (f"no d_model that is a multiple of {multiple} gives d_h/d_model within ±{ratio_tolerance:.0%} "
                f"of {ratio:g} at this budget (continuous solution d_model≈{self.width(layers, k, ratio):.0f})")

    def solve_fixed(self, layers: int, d_model: int, k: int) -> ArchConfig | str:
        """Fixed attention: this ``L`` and ``d_model``, ``d_h`` (and ``wider``) from the budget; or the reason."""
        if reason := self.width_error(d_model):
            return reason
        ffn = self.best_ffn(layers, d_model, k)
        if ffn is None:
            return f"attention and embeddings alone exceed the budget {self.budget:,}"
        d_h = ffn[0]
        arch = self.arch(layers, d_model, k, *ffn)
        if abs(self.deviation(arch)) > self.tolerance:
            return (f"d_h={d_h} is {self.deviation(arch):+.3%} off the budget (tolerance ±{self.tolerance:.3%}; "
                    "raise --tolerance)")
        return arch


def rebalance_ffn(arch: ArchConfig, budget: int, hidden_multiple: int = 1) -> ArchConfig:
    """``arch`` with the FFN hidden size (and ``wider``) whose exact count is closest to ``budget``: the parameters
    its grouped key/value heads save go to its ``L K`` sub-MLPs, width and depth unchanged (steps of ``3 d``, or
    of ``3 L K d hidden_multiple`` with aligned widths). A shape whose count is the budget already is returned."""
    total = arch.n_params()["total"]
    if total == budget:
        return arch
    d, sub_mlps = arch.d_model, arch.n_layers * arch.ffn.k
    step = 3 * d  # parameters per hidden unit; rounded to the nearest unit as BudgetMatcher.best_ffn does
    units = sub_mlps * arch.ffn.hidden + arch.ffn.wider + (2 * (budget - total) + step) // (2 * step)
    if hidden_multiple > 1:
        hidden = max(1, round(units / sub_mlps / hidden_multiple)) * hidden_multiple
        return arch.replace(ffn=FFNShape(arch.ffn.k, hidden, 0))
    hidden, wider = divmod(units, sub_mlps)
    return arch.replace(ffn=FFNShape(arch.ffn.k, max(1, hidden), wider if hidden >= 1 else 0))
