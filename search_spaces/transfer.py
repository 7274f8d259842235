"""Carrying a shape found on a proxy to a target preset (``nas rerun``): what is kept, what is re-solved, and refusals.

A shape has two parts, and each carries by its own rule:

- **The FFN and the width** (hourglass and joint shapes). ``K`` and ``d_h/d_model`` are kept; the
  depth is kept when the proxy's baseline depth equals the target's (the ``cpu`` proxy keeps
  GPT-2 small's 12 layers) and scaled by ``L_target / L_proxy`` otherwise; ``d_model`` is re-solved
  for the *target's* budget (its baseline's exact parameter count, vocabulary and head dim) by the
  hourglass solver, within the proxy space's tolerances. A point the target grid cannot match is
  refused with the solver's reason. A shape with the proxy baseline's FFN and width takes the
  target baseline's (a Prism schedule changes neither).
- **The head schedule** (Prism and joint shapes). When the source and target have the same depth
  and baseline head count (``cpu`` -> ``gpt2-124m``: 12 x 12) the *counts* carry unchanged. For
  other bases the *ratios* ``h_l / h_base`` carry, layer ``l'`` of the target taking the ratio of
  source layer ``floor(l' L_s / L_t)``: what the Prism rule is about is head width relative to
  the baseline (``d_head_l / d_head_base = h_base / h_l``), and a count such as 3 means a
  different width under ``h_base`` 12 and 16. A ratio that gives no whole head count dividing
  ``d_model`` is refused; so is a stretched schedule that breaks the Prism rules (plateau lengths
  scaled by the depth ratio, the baseline plateau at least half the layers).

- **The key/value heads** (grouped-query shapes, ``search_spaces.kv``). Each layer's group size
  ``h_l / kv_l`` carries as the head counts do (layer ``l'`` takes source layer ``floor(l' L_s / L_t)``'s);
  the shape is carried as its multi-head counterpart (the FFN the budget gives it without GQA) and the
  target's FFN hidden size then takes what the target's grouped key/value heads save. A group size that
  does not divide the target layer's head count is refused.

Every carried shape is re-checked: heads divide ``d_model``, the budget within tolerance.
Imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from nas.arch import ArchConfig, plateaus
from search_spaces.budget import rebalance_ffn
from search_spaces.hourglass import HourglassSpace
from search_spaces.prism import PrismSpace


@dataclass(frozen=True)
class Transfer:
    """The outcome for one shape: the target shape and how it was carried, or why it cannot be."""

    source: ArchConfig
    target: ArchConfig | None
    rules: tuple[str, ...]  # how each part was carried, in words
    refused: str | None = None

    @property
    def ok(self) -> bool:
        return self.target is not None


def _refuse(source: ArchConfig, reason: str, rules: list[str]) -> Transfer:
    return Transfer(source, None, tuple(rules), reason)


def _same_ffn_and_width(arch: ArchConfig, baseline: ArchConfig) -> bool:
    return (arch.d_model, arch.n_layers, arch.ffn) == (baseline.d_model, baseline.n_layers, baseline.ffn)


def transfer_ffn(arch: ArchConfig, proxy_baseline: ArchConfig, target_baseline: ArchConfig,
                 proxy_space: dict[str, Any]) -> ArchConfig | str:
    """The target's uniform-head shape for ``arch``'s FFN and width (see the module docstring), or a refusal."""
    if _same_ffn_and_width(arch, proxy_baseline):
        return target_baseline
    t = target_baseline
    k, ratio = arch.ffn.k, arch.ffn.hidden / arch.d_model
    fixed = arch.d_model == proxy_baseline.d_model and arch.n_layers == proxy_baseline.n_layers
    layers = arch.n_layers if proxy_baseline.n_layers == t.n_layers else \
        max(1, round(arch.n_layers * t.n_layers / proxy_baseline.n_layers))
    space = HourglassSpace(
        t.n_layers, t.d_model, t.heads[0], vocab_size=t.vocab_size, tie_embeddings=t.tie_embeddings,
        ffn_hidden=t.ffn.hidden, k_values=(k,), layer_values=None if fixed else (layers,),
        ratio_values=None if fixed else (ratio,), tolerance=float(proxy_space.get("tolerance") or 0.001),
        ratio_tolerance=float(proxy_space.get("ratio_tolerance") or 0.15), fix="attention" if fixed else None)
    solved = space.solve(k, t.n_layers if fixed else layers, None if fixed else ratio)
    if isinstance(solved, str):
        where = f"K={k}" + ("" if fixed else f" L={layers} d_h/d_model={ratio:.3g}")
        return f"the target's budget of {space.budget:,} parameters has no shape for {where}: {solved}"
    return solved


def transfer_heads(heads: tuple[int, ...], target: ArchConfig, min_plateau: int = 2,
                   max_plateau: int = 4) -> tuple[tuple[int, ...], str] | str:
    """``heads`` (ending at their baseline count) carried onto ``target``'s depth and baseline count, with the
    rule used; or a refusal."""
    source_layers, source_base = len(heads), heads[-1]
    target_layers, target_base = target.n_layers, target.heads[-1]
    if len(set(heads)) == 1:
        return (target_base,) * target_layers, "uniform heads: the target's baseline count"
    if (source_layers, source_base) == (target_layers, target_base):
        carried, rule = tuple(heads), f"head counts carried unchanged (same depth {target_layers} and h_base)"
    else:
        carried_list = []
        for layer in range(target_layers):
            h = heads[math.floor(layer * source_layers / target_layers)]
            value = Fraction(h, source_base) * target_base
            if value.denominator != 1:
                return (f"{h} of {source_base} heads is {Fraction(h, source_base)} of h_base; at the target's "
                        f"h_base={target_base} that is {float(value):.3g} heads, not a whole head count")
            carried_list.append(int(value))
        carried = tuple(carried_list)
        rule = (f"head-count ratios h_l/h_base carried from L={source_layers}, h_base={source_base} "
                f"to L={target_layers}, h_base={target_base}")
    scale = target_layers / source_layers
    space = PrismSpace(target_layers, target.d_model, target_base, min_plateau=max(1, math.floor(min_plateau * scale)),
                       max_plateau=max(1, math.ceil(max_plateau * scale)), vocab_size=target.vocab_size,
                       tie_embeddings=target.tie_embeddings, ffn=target.ffn)
    reasons = space.validate_schedule(carried)
    if reasons:
        return f"the carried schedule {','.join(map(str, carried))} is not a valid Prism schedule: {reasons[0]}"
    return carried, rule


def transfer_shape(arch: ArchConfig, proxy_space: dict[str, Any], proxy_baseline: ArchConfig,
                   target_baseline: ArchConfig) -> Transfer:
    """Carry ``arch`` (a member of the proxy space ``proxy_space``, as ``describe()`` gave it) to the target preset
    whose baseline is ``target_baseline``."""
    rules: list[str] = []
    groups = arch.kv_groups() if arch.grouped else None
    if groups is not None:  # its multi-head counterpart: the FFN the proxy's budget gives it without GQA
        arch = rebalance_ffn(arch.replace(kv_heads=[]), int(proxy_space.get("budget") or
                                                            proxy_baseline.n_params()["total"]))
    shape = arch.replace(heads=[arch.heads[-1]] * arch.n_layers)  # its FFN and width, with uniform heads
    ffn = transfer_ffn(shape, proxy_baseline, target_baseline, proxy_space)
    if isinstance(ffn, str):
        return _refuse(arch, ffn, rules)
    if ffn == target_baseline and not _same_ffn_and_width(shape, proxy_baseline):
        return _refuse(arch, "its FFN and width re-solve to the target's baseline shape", rules)
    rules.append("FFN and width: the target baseline's" if _same_ffn_and_width(shape, proxy_baseline) else
                 f"FFN and width: K={ffn.ffn.k} and d_h/d_model kept, L={ffn.n_layers}, d_model={ffn.d_model} "
                 f"re-solved for the target's budget")
    plateau_options = {k: proxy_space[k] for k in ("min_plateau", "max_plateau") if proxy_space.get(k)}
    heads = transfer_heads(arch.heads, ffn, **plateau_options)
    if isinstance(heads, str):
        return _refuse(arch, heads, rules)
    carried, rule = heads
    rules.append(f"heads: {rule}")
    target = ffn.replace(heads=list(carried))
    budget = target_baseline.n_params()["total"]
    if groups is not None:
        kv = transfer_kv(groups, target)
        if isinstance(kv, str):
            return _refuse(arch, kv, rules)
        target = rebalance_ffn(target.replace(kv_heads=[h // g for h, g in zip(target.heads, kv[0])]), budget)
        rules.append(f"key/value heads: {kv[1]}; the FFN's hidden size re-solved for the target's budget")
    tolerance = float(proxy_space.get("tolerance") or 0.001)
    deviation = (target.n_params()["total"] - budget) / budget
    if abs(deviation) > tolerance:
        return _refuse(arch, f"{target.label()} is {deviation:+.3%} off the target's budget {budget:,} "
                             f"(tolerance ±{tolerance:.3%})", rules)
    return Transfer(arch, target, tuple(rules))


def transfer_kv(groups: tuple[int, ...], target: ArchConfig) -> tuple[tuple[int, ...], str] | str:
    """Group sizes ``groups`` carried onto ``target``'s layers (with the rule used), or a refusal."""
    source_layers, target_layers = len(groups), target.n_layers
    carried = tuple(groups[math.floor(layer * source_layers / target_layers)] for layer in range(target_layers))
    for layer, (h, g) in enumerate(zip(target.heads, carried), start=1):
        if h % g:
            return f"group size {g} does not divide the {h} heads of the target's layer {layer}"
    same = source_layers == target_layers
    return carried, (f"group sizes h_l/kv_l {schedule_text(carried)} carried "
                     + ("unchanged" if same else f"from L={source_layers} to L={target_layers}"))


def schedule_text(heads: tuple[int, ...]) -> str:
    return ",".join(f"{h}x{n}" for h, n in plateaus(heads))
