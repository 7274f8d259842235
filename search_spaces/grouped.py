"""The spaces with a grouped-query attention axis that are not a grid point of their own (``search_spaces.kv``).

- ``UniformGroupPrismSpace``: the Prism space with one group size in every layer (``--space prism
  --kv-groups``): for each group size ``g`` the Prism schedules whose head counts ``g`` divides, each
  with the FFN that takes the parameters the smaller W_K, W_V save (``search_spaces.budget.rebalance_ffn``;
  the same for every schedule of one ``g``), so every member has the baseline's parameter count.
- ``KVScheduleSpace``: any of the three spaces with a key/value schedule per member (``--kv-schedule``):
  every member of the space without GQA times every group schedule its heads allow, its FFN hidden
  size re-solved for the budget. Counted by the programme of ``search_spaces.kv`` (Prism schedules and
  group schedules at once), never by listing.

(The Hourglass grid and the joint space take a uniform group size as one more grid axis themselves:
``HourglassSpace(kv_groups=...)``.) ``g = 1`` is always a group size, so each space holds every member of
the space without GQA, the baseline first. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from nas.arch import ArchConfig, format_plateaus
from search_spaces.base import SearchSpace
from search_spaces.budget import rebalance_ffn
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.kv import GQA_RULES, KVRule
from search_spaces.kv_count import count_over_prism
from search_spaces.prism import PrismSpace

if TYPE_CHECKING:
    from optuna.trial import BaseTrial


def with_kv_columns(row: dict[str, Any], arch: ArchConfig, budget: int) -> dict[str, Any]:
    """The inner space's listing ``row`` of ``arch`` with its key/value heads, KV cache and budget match.

    A grouped member is not the (multi-head) baseline, under whichever column its space names it in
    (``is_baseline`` in Prism rows, ``kind`` in Hourglass and joint rows); no column is added that the space's
    other rows lack, so every row of a listing has the same columns (CSV takes them from the first row)."""
    total = arch.n_params()["total"]
    out = {**row, "kv_heads": list(arch.kv_per_layer()), "kv_plateaus": format_plateaus(arch.kv_per_layer()),
           "kv_groups": list(arch.kv_groups()), "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token(),
           "d_h": arch.ffn.hidden, "wider": arch.ffn.wider, "params": total,
           "params_attention": arch.n_params()["attention"], "params_ffn": arch.n_params()["ffn"],
           "budget_deviation": (total - budget) / budget}
    if arch.grouped and "is_baseline" in out:
        out["is_baseline"] = False
    if arch.grouped and out.get("kind") == "baseline":
        out["kind"] = "gqa"
    return out


class UniformGroupPrismSpace(SearchSpace):
    """Prism schedules x one group size per member (module docstring); the multi-head baseline first."""

    name = "prism"
    table_columns = ("plateaus", "kv_plateaus", "d_h", "wider", "kv_cache_bytes_per_token", "budget_deviation")

    def __init__(self, prism: PrismSpace, rule: KVRule) -> None:
        self.prism, self.rule = prism, rule
        self.rules = prism.rules + GQA_RULES
        self.inner_space = prism
        base = prism.baseline()
        self.budget = base.n_params()["total"]
        self.spaces: dict[int, PrismSpace] = {}
        for g in rule.groups:
            grouped = base.replace(kv_heads=[prism.h_base // g] * prism.layers)
            ffn = rebalance_ffn(grouped, self.budget).ffn
            self.spaces[g] = prism if g == 1 else prism.with_kv_group(g, rule.min_kv_heads, ffn)

    @cached_property
    def _caps(self) -> tuple[int, int, int]:
        spaces = self.spaces.values()
        return (max(p.max_plateaus for p in spaces), max(1, max(len(p.candidates) for p in spaces)),
                max(p.draw_resolution() for p in spaces))

    def baseline(self) -> ArchConfig:
        return self.prism.baseline()

    def __iter__(self) -> Iterator[ArchConfig]:
        for space in self.spaces.values():
            yield from space

    def count(self) -> int:
        return sum(space.count() for space in self.spaces.values())

    def validate(self, arch: ArchConfig) -> list[str]:
        groups = set(arch.kv_groups())
        if len(groups) > 1:
            return [f"group sizes {format_plateaus(arch.kv_groups())} differ by layer: this space takes one group "
                    "size in every layer (--kv-schedule for a schedule)"]
        g = groups.pop()
        if g not in self.spaces:
            return [f"group size {g} is not one of {','.join(map(str, self.spaces))}"]
        return self.spaces[g].validate(arch)

    def suggest(self, trial: BaseTrial) -> ArchConfig:
        """``kv_group`` (a categorical over the group sizes), then the Prism parameters with study-wide caps."""
        space = self.spaces[trial.suggest_categorical("kv_group", tuple(self.spaces))]
        n_cap, rank_cap, resolution = self._caps
        return space.member(space.suggest_schedule(trial, n_cap=n_cap, rank_cap=rank_cap, resolution=resolution))

    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        self._require_member(arch)
        g = arch.kv_groups()[0]
        return {"kv_group": g, **self.spaces[g].schedule_params(arch.heads, resolution=self._caps[2])}

    def with_kv(self, arch: ArchConfig, kv_heads: Sequence[int]) -> ArchConfig:
        """``arch``'s heads with these key/value heads and the FFN this space gives them."""
        return rebalance_ffn(arch.replace(kv_heads=list(kv_heads)), self.budget)

    def describe(self) -> dict[str, Any]:
        return {**self.prism.describe(), **self.rule.describe()}

    def row(self, arch: ArchConfig) -> dict[str, Any]:
        g = arch.kv_groups()[0]
        return {**with_kv_columns(self.spaces[g].row(arch), arch, self.budget), "kv_group": g, "key": arch.key()}


class KVScheduleSpace(SearchSpace):
    """A space without GQA, each member with every key/value schedule its heads allow (module docstring)."""

    def __init__(self, inner: PrismSpace | HourglassSpace | JointSpace, rule: KVRule, hidden_multiple: int = 1) -> None:
        self.inner, self.rule, self.hidden_multiple = inner, rule, hidden_multiple
        self.inner_space = inner
        self.name = inner.name
        self.rules = inner.rules + GQA_RULES
        self.hourglass = inner.hourglass if isinstance(inner, JointSpace) else inner \
            if isinstance(inner, HourglassSpace) else None
        self.budget = self.hourglass.budget if self.hourglass is not None else inner.baseline().n_params()["total"]
        shown = ("plateaus",) if isinstance(inner, PrismSpace) else tuple(
            c for c in inner.table_columns if c not in ("d_h", "wider", "params", "budget_deviation"))
        self.table_columns = (*shown, "kv_plateaus", "d_h", "wider", "params", "kv_cache_bytes_per_token",
                              "budget_deviation")
        layers = [inner.layers] if isinstance(inner, PrismSpace) else [a.n_layers for a in self.hourglass]
        self.resolution = rule.draw_resolution(max(layers))

    @cached_property
    def _shapes(self) -> dict[tuple[int, int, int], ArchConfig]:
        """The hourglass members by (L, d_model, K): what a grouped member's width, depth and stack came from."""
        assert self.hourglass is not None
        return {(a.n_layers, a.d_model, a.ffn.k): a for a in self.hourglass}

    def member(self, shape: ArchConfig, groups: Sequence[int]) -> ArchConfig:
        """The member of multi-head ``shape`` with group sizes ``groups``: its FFN takes what they save."""
        if set(groups) == {1}:
            return shape
        grouped = shape.replace(kv_heads=[h // g for h, g in zip(shape.heads, groups)])
        return rebalance_ffn(grouped, self.budget, self.hidden_multiple)

    def with_kv(self, arch: ArchConfig, kv_heads: Sequence[int]) -> ArchConfig:
        """``arch``'s heads with these key/value heads and the FFN this space gives them."""
        shape = self.inner_of(arch)
        grouped = (shape or arch).replace(kv_heads=list(kv_heads))
        return rebalance_ffn(grouped, self.budget, self.hidden_multiple) if grouped.grouped else grouped

    def inner_of(self, arch: ArchConfig) -> ArchConfig | None:
        """The multi-head member ``arch`` is a grouped version of (its FFN before re-solving), or None."""
        if isinstance(self.inner, PrismSpace):
            return arch.replace(kv_heads=[], ffn=self.inner.ffn)
        shape = self._shapes.get((arch.n_layers, arch.d_model, arch.ffn.k))
        if shape is None:
            return None
        return shape if isinstance(self.inner, HourglassSpace) else shape.replace(heads=list(arch.heads))

    def baseline(self) -> ArchConfig:
        return self.inner.baseline()

    def __iter__(self) -> Iterator[ArchConfig]:
        for shape in self.inner:
            for groups in self.rule.group_schedules(shape.heads):
                yield self.member(shape, groups)

    @cached_property
    def _count(self) -> int:
        if isinstance(self.inner, PrismSpace):
            return count_over_prism(self.rule, self.inner)
        if isinstance(self.inner, JointSpace):
            return sum(count_over_prism(self.rule, self.inner.prism_of(shape)) for shape in self.inner.hourglass)
        return sum(self.rule.count(shape.heads) for shape in self.inner)

    def count(self) -> int:
        return self._count

    def validate(self, arch: ArchConfig) -> list[str]:
        shape = self.inner_of(arch)
        if shape is None:
            return [f"no member of the {self.name} space has layers={arch.n_layers}, d_model={arch.d_model} and "
                    f"K={arch.ffn.k}"]
        reasons = self.inner.validate(shape) + self.rule.validate(arch.heads, arch.kv_per_layer())
        if not reasons and arch != (expected := self.member(shape, arch.kv_groups())):
            reasons.append(f"its FFN is {arch.ffn.k}x{arch.ffn.hidden}+{arch.ffn.wider}; with these key/value "
                           f"heads the budget gives {expected.ffn.k}x{expected.ffn.hidden}+{expected.ffn.wider}")
        return reasons

    def suggest(self, trial: BaseTrial) -> ArchConfig:
        """The space's own parameters, then ``kv_draw`` in ``[0, resolution)``: the group schedule of that index
        among the drawn heads' schedules (in proportion, as ``search_spaces.prism`` draws plateau counts)."""
        shape = self.inner.suggest(trial)
        n = self.rule.count(shape.heads)
        draw = trial.suggest_int("kv_draw", 0, self.resolution - 1)
        return self.member(shape, self.rule.unrank(shape.heads, min(n - 1, draw * n // self.resolution)))

    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        self._require_member(arch)
        shape = self.inner_of(arch)
        assert shape is not None
        n, index = self.rule.count(shape.heads), self.rule.rank(shape.heads, arch.kv_groups())
        return {**self.inner.params_of(shape), "kv_draw": -(-index * self.resolution // n)}

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), **self.rule.describe()}

    def row(self, arch: ArchConfig) -> dict[str, Any]:
        shape = self.inner_of(arch)
        assert shape is not None
        row = with_kv_columns(self.inner.row(shape), arch, self.budget)
        if "d_h_over_d_model" in row:
            row["d_h_over_d_model"] = arch.ffn.hidden / arch.d_model
        row["key"] = arch.key()
        return row
