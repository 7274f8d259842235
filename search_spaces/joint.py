"""The joint space: a budget-matched Hourglass FFN shape with a Prism head schedule on top.

A member is an hourglass member (``search_spaces.hourglass``) whose uniform heads
``h_base = d_model / head_dim`` are replaced by any valid Prism schedule for its own
``(L, d_model, h_base)`` (``search_spaces.prism``). The schedule changes neither the parameter
count nor the FLOPs (W_Q, W_K, W_V, W_O stay d_model x d_model), so every member keeps the
hourglass member's budget match. Count = sum over hourglass members of their Prism counts. With
grouped-query attention on the hourglass grid (``kv_groups``) a member of group size ``g`` takes the Prism
schedules whose head counts ``g`` divides (W_K, W_V stay ``d / g x d`` whatever the schedule).

Sampling keeps every parameter's range fixed within a study although L and d_model vary:
the hourglass parameters come first, then the schedule parameters of ``PrismSpace.suggest_schedule``
with the caps ``n_plateaus <= max over widths`` and ``plateau_i_rank < max candidates over widths``;
values beyond what the sampled width allows are clamped deterministically (identity on valid
schedules, so ``params_of`` inverts ``suggest`` exactly).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from nas.arch import ArchConfig
from nas.errors import UsageError
from search_spaces.base import SearchSpace
from search_spaces.hourglass import HourglassSpace
from search_spaces.hourglass_rules import HOURGLASS_RULES
from search_spaces.prism import PRISM_RULES, PrismSpace

if TYPE_CHECKING:
    from optuna.trial import BaseTrial


class JointSpace(SearchSpace):
    """Hourglass shape x Prism schedule, the uniform-head conventional baseline first."""

    name = "joint"
    rules = PRISM_RULES + HOURGLASS_RULES
    table_columns = ("kind", "k", "layers", "d_model", "d_h", "params", "budget_deviation", "plateaus")

    def __init__(
        self,
        hourglass: HourglassSpace,
        *,
        min_plateau: int = 2,
        max_plateau: int = 4,
        min_baseline: int | None = None,  # None: ceil(L/2) of each member's own L
        hw_aligned: bool = False,
        min_head_dim: int | None = None,
        max_head_dim: int | None = None,
    ) -> None:
        self.hourglass = hourglass
        self.prism_options = {"min_plateau": min_plateau, "max_plateau": max_plateau, "min_baseline": min_baseline,
                                  "hw_aligned": hw_aligned, "min_head_dim": min_head_dim,
                                  "max_head_dim": max_head_dim}
        _ = self._prisms  # build every width now, so bad Prism options fail at construction
        if hourglass.grouped:
            self.table_columns = (*self.table_columns, "kv_group", "kv_cache_bytes_per_token")

    @cached_property
    def _prisms(self) -> dict[str, PrismSpace]:
        """The Prism space of each hourglass member, by the member's key."""
        return {arch.key(): self._prism_for(arch) for arch in self.hourglass}

    def prism_of(self, shape: ArchConfig) -> PrismSpace:
        """The Prism space of one hourglass member (uniform heads)."""
        return self._prisms[shape.key()]

    def _prism_for(self, arch: ArchConfig) -> PrismSpace:
        return PrismSpace(arch.n_layers, arch.d_model, arch.heads[0], vocab_size=arch.vocab_size,
                          tie_embeddings=arch.tie_embeddings, ffn=arch.ffn, **self.prism_options,
                          kv_group=arch.kv_groups()[0], min_kv_heads=self.hourglass.min_kv_heads)

    @cached_property
    def _caps(self) -> tuple[int, int, int]:
        """Study-wide ranges of the schedule parameters: plateaus, ranks, and the plateau-count draw."""
        prisms = self._prisms.values()
        return (max(p.max_plateaus for p in prisms), max(1, max(len(p.candidates) for p in prisms)),
                max(p.draw_resolution() for p in prisms))

    def _uniform(self, arch: ArchConfig) -> ArchConfig | None:
        """The hourglass member under a schedule: the same shape with uniform heads."""
        if arch.d_model % self.hourglass.head_dim:
            return None
        try:  # group sizes kept: h_base / g key/value heads
            return arch.replace(heads=[arch.d_model // self.hourglass.head_dim] * arch.n_layers)
        except UsageError:  # a group size that does not divide h_base: no member's
            return None

    # ----------------------------------------------------------------- the SearchSpace API
    def baseline(self) -> ArchConfig:
        return self.hourglass.baseline()

    def __iter__(self) -> Iterator[ArchConfig]:
        for arch in self.hourglass:
            yield from self._prisms[arch.key()]

    def count(self) -> int:
        return sum(p.count() for p in self._prisms.values())

    def validate(self, arch: ArchConfig) -> list[str]:
        shape = self._uniform(arch)
        if shape is None:
            return [f"d_model={arch.d_model} is not a multiple of head_dim={self.hourglass.head_dim}, or its group "
                    f"sizes {','.join(map(str, arch.kv_groups()))} do not divide its d_model/head_dim heads"]
        reasons = self.hourglass.validate(shape)
        if reasons:
            return [f"FFN shape: {r}" for r in reasons]
        return self._prisms[shape.key()].validate(arch)

    def suggest(self, trial: BaseTrial) -> ArchConfig:
        """Hourglass parameters (``ffn_draw``, ``k``, ``layers``, ``d_h_over_d_model``) then ``n_plateaus_draw``,
        ``plateau_{i}_len`` and ``plateau_{i}_rank`` with study-wide caps (module docstring)."""
        prism = self._prisms[self.hourglass.suggest(trial).key()]
        n_cap, rank_cap, resolution = self._caps
        return prism.member(prism.suggest_schedule(trial, n_cap=n_cap, rank_cap=rank_cap, resolution=resolution))

    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        self._require_member(arch)
        shape = self._uniform(arch)
        return {**self.hourglass.params_of(shape),
                **self._prisms[shape.key()].schedule_params(arch.heads, resolution=self._caps[2])}

    def describe(self) -> dict[str, Any]:
        # max_head_dim only when set: the description is part of a study's identity, and older studies have none
        options = {k: v for k, v in self.prism_options.items() if k != "max_head_dim" or v is not None}
        return {**self.hourglass.describe(), **options, "space": self.name}

    def row(self, arch: ArchConfig) -> dict[str, Any]:
        shape = self._uniform(arch)
        row = self.hourglass.row(shape)
        prism_row = self._prisms[shape.key()].row(arch)
        row.update({key: prism_row[key] for key in ("heads", "plateaus", "head_dims", "n_plateaus", "baseline_layers")})
        if "kv_heads" in row:  # the schedule's own, per layer (the skeleton's were its uniform heads' groups)
            row["kv_heads"] = list(arch.kv_per_layer())
        suffix = "" if prism_row["is_baseline"] else "+prism"
        row["kind"] = "baseline" if arch == self.baseline() else row["kind"] + suffix
        row["key"] = arch.key()
        return row
