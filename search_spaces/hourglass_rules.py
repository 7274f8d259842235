"""The Hourglass space's design rules (``search_spaces.base.Rule``): the covariates ``nas rules`` reads of each shape.

The default catalog: the width-depth U (``log2_d_over_L`` and its square), ``K_gt_1`` and ``d_h_over_d``; opt-in:
``log2_K``, ``log2_layers``. ``search_spaces.hourglass.HourglassSpace.rules`` declares them.
"""

from __future__ import annotations

import math

from nas.arch import ArchConfig
from search_spaces.base import Rule


def log2_d_over_L(shape: ArchConfig, baseline: ArchConfig) -> float:
    """``log2(d_model / L)``: the width-depth axis, whose loss the Hourglass paper finds U-shaped (optimum 100-250)."""
    return math.log2(shape.d_model / shape.n_layers)


def log2_d_over_L_sq(shape: ArchConfig, baseline: ArchConfig) -> float:
    """``log2(d_model / L)^2``: with ``log2_d_over_L``, the U; its optimum ``d/L* = 2^(-b_1 / (2 b_2))``."""
    return log2_d_over_L(shape, baseline) ** 2


def d_over_l_text(value: float) -> str:
    """A ``log2_d_over_L`` value in the user's words: ``d_model/L = 32``."""
    return f"d_model/L = {2 ** value:.0f}"


def k_gt_1(shape: ArchConfig, baseline: ArchConfig) -> float:
    """1 for a stack of ``K > 1`` residual sub-MLPs (an hourglass FFN), 0 for one (conventional)."""
    return float(shape.ffn.k > 1)


def d_h_over_d(shape: ArchConfig, baseline: ArchConfig) -> float:
    """Each sub-MLP's hidden size over ``d_model`` (``d_h / d``; 8/3 for LLaMA's conventional FFN)."""
    return shape.ffn.hidden / shape.d_model


def log2_k(shape: ArchConfig, baseline: ArchConfig) -> float:
    """``log2 K``: each doubling of the sub-MLP stack."""
    return math.log2(shape.ffn.k)


def log2_layers(shape: ArchConfig, baseline: ArchConfig) -> float:
    """``log2 L``: each doubling of depth (at the matched budget, width falls as depth grows)."""
    return math.log2(shape.n_layers)


HOURGLASS_RULES = (
    Rule("log2_d_over_L", "doubling of d_model/L", "log2 of d_model over the number of layers",
         "each doubling of d_model/L", 1.0, log2_d_over_L, value_text=d_over_l_text),
    Rule("log2_d_over_L_sq", "(log2 d_model/L)^2", "the square of log2 d_model/L: the width-depth curve's curvature",
         "the width-depth curve's curvature", 1.0, log2_d_over_L_sq, square_of="log2_d_over_L"),
    Rule("K_gt_1", "K > 1", "1 when the FFN is a stack of K > 1 residual sub-MLPs", "an hourglass FFN (K > 1)",
         1.0, k_gt_1),
    Rule("d_h_over_d", "d_h/d_model", "each sub-MLP's hidden size over d_model", "raising d_h/d_model by 0.1",
         0.1, d_h_over_d),
    Rule("log2_K", "doubling of K", "log2 of the number of sub-MLPs per layer", "each doubling of K", 1.0, log2_k,
         default=False),
    Rule("log2_layers", "doubling of L", "log2 of the number of layers", "each doubling of depth", 1.0, log2_layers,
         default=False),
)
