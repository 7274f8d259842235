"""Hourglass FFN shapes, every member matched to one parameter budget.

Paper: Hourglass FFN, stacks of ``K`` wide-narrow-wide residual SwiGLU sub-MLPs ``d -> d_h -> d`` with
``d_h < d``, budgets matched to within 0.001 %, the saved parameters re-spent on width, depth or attention.
The budget arithmetic and the solver live in ``search_spaces.budget`` (``BudgetMatcher``).

Fixed-attention mode (the paper's first study): ``d_model`` and ``L`` stay the baseline's, so the
attention parameters do not move; only ``K`` varies and ``d_h`` follows from the budget (``K d_h``
is then constant, so ``d_h/d_model`` is an outcome, not an input).

The baseline is the conventional ``K = 1`` FFN (``d_h = ffn_hidden``, LLaMA's ~8/3 d_model) of the
reference shape; with a different budget, the solver picks the width at the reference's ``L``
whose ``d_h / d_model`` is closest to the reference's.

Grouped-query attention (``kv_groups``, ``search_spaces.kv``): the group size ``g`` is one more grid axis;
at ``g > 1`` every layer keeps ``h / g`` key/value heads and the solver spends the parameters the smaller
W_K and W_V save on the point's width, depth or FFN (``search_spaces.budget``), within the same tolerance;
with fixed attention, on ``d_h``. ``g = 1`` is the grid without GQA.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from nas.arch import (
    MAX_K,
    MAX_LAYERS,
    MAX_PARAMS,
    MAX_VOCAB,
    MAX_WIDTH,
    ArchConfig,
    FFNShape,
    format_plateaus,
    llama_ffn_hidden,
    uniform,
)
from nas.errors import UsageError
from search_spaces.base import SearchSpace, check_heads, check_positive
from search_spaces.budget import BudgetMatcher
from search_spaces.hourglass_rules import HOURGLASS_RULES

if TYPE_CHECKING:
    from optuna.trial import BaseTrial

DEFAULT_K_VALUES = (1, 2, 4, 6, 8)
MAX_GRID_POINTS = 20_000  # solving is milliseconds a point: a grid larger than this is a typo
DEFAULT_RATIO_VALUES = (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
# default L grid: these multiples of the baseline's L (2, 3, 4, 6, 9, 12, 18, 24 at L = 12). The shallow end puts
# d_model / L between about 100 and 180 at the cpu budget, where the Hourglass paper's U-shaped width-depth curve has
# its optimum (100-250 at 113M), so both branches of the U lie inside the grid.
DEFAULT_LAYER_FACTORS = (1 / 6, 0.25, 1 / 3, 0.5, 0.75, 1.0, 1.5, 2.0)
FIX_CHOICES = ("attention",)


@dataclass(frozen=True)
class GridPoint:
    """One point of the grid; ``ratio`` (target d_h/d_model) is None in fixed-attention mode."""

    k: int
    layers: int
    ratio: float | None
    kv_group: int = 1  # query heads per key/value head (grouped-query attention); 1: multi-head

    def __str__(self) -> str:
        ratio = "" if self.ratio is None else f" d_h/d_model={self.ratio:g}"
        group = f" group size {self.kv_group}" if self.kv_group > 1 else ""
        return f"K={self.k} L={self.layers}{ratio}{group}"


@dataclass(frozen=True)
class Unmatched:
    """A grid point left out of the space, and why (budget not matchable, duplicate shape, ...)."""

    point: GridPoint
    reason: str


@dataclass
class _Solution:
    """The solved grid: members by key (baseline first) with their grid point, every point that
    solved (duplicates included) with its member, and the points left out."""

    members: dict[str, tuple[ArchConfig, GridPoint | None]]
    by_point: dict[GridPoint, ArchConfig]
    unmatched: list[Unmatched]


def _sorted_unique(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(sorted(set(values)))


class HourglassSpace(SearchSpace):
    """Budget-matched grid over K, L and d_h/d_model (d_model solved), the conventional baseline first."""

    name = "hourglass"
    rules = HOURGLASS_RULES
    table_columns = ("kind", "k", "layers", "d_model", "d_h", "wider", "params", "budget_deviation",
                     "d_model_per_layer", "d_h_over_d_model")

    def __init__(
        self,
        layers: int,
        d_model: int,
        heads: int,
        *,
        vocab_size: int = 256,
        tie_embeddings: bool = True,
        ffn_hidden: int | None = None,  # the reference's conventional SwiGLU width; None: LLaMA's rule
        budget: int | None = None,  # None: the reference shape's own parameter count
        k_values: Sequence[int] | None = None,
        layer_values: Sequence[int] | None = None,
        ratio_values: Sequence[float] | None = None,
        head_dim: int | None = None,  # None: the reference's d_model / heads
        tolerance: float = 0.001,  # |N - B| / B allowed (0.1%)
        ratio_tolerance: float = 0.15,  # |achieved d_h/d_model / target - 1| allowed (widths step by head_dim)
        fix: str | None = None,  # "attention": keep the baseline's d_model and L
        hidden_multiple: int = 1,  # d_h a multiple of this (64 for GPU presets) and no wider sub-MLPs; 1: exact
        kv_groups: Sequence[int] = (1,),  # group sizes of grouped-query attention on the grid (1 always among them)
        min_kv_heads: int = 1,  # a grouped member keeps at least this many key/value heads per layer
    ) -> None:
        for name, value, maximum in (("layers", layers, MAX_LAYERS), ("d_model", d_model, MAX_WIDTH),
                                     ("vocab_size", vocab_size, MAX_VOCAB)):
            check_positive(name, value, maximum=maximum)
        check_heads(heads, d_model)
        head_dim = d_model // heads if head_dim is None else head_dim
        check_positive("head_dim", head_dim, maximum=MAX_WIDTH)
        if d_model % head_dim:
            raise UsageError(f"head_dim={head_dim} does not divide the baseline's d_model={d_model}")
        if fix not in (None, *FIX_CHOICES):
            raise UsageError(f"unknown fix {fix!r}; the only part that can be fixed is 'attention'")
        if fix and (layer_values is not None or ratio_values is not None):
            raise UsageError("fix=attention keeps the baseline's L and d_model, so d_h/d_model follows from K: "
                             "drop --layer-values and --ratio-values")
        if not 0 < tolerance < 1:
            raise UsageError(f"tolerance={tolerance!r} is invalid: give a fraction in (0, 1), e.g. 0.001 for 0.1%")
        if not 0 < ratio_tolerance < 1:
            raise UsageError(f"ratio_tolerance={ratio_tolerance!r} is invalid: give a fraction in (0, 1)")
        self.k_values = _sorted_unique(DEFAULT_K_VALUES if k_values is None else k_values)
        for k in self.k_values:
            check_positive("k", k, "the FFN stack depth K is an integer >= 1", maximum=MAX_K)
        if layer_values is None:
            layer_values = [max(1, round(layers * f)) for f in DEFAULT_LAYER_FACTORS]
            if max(layer_values) > MAX_LAYERS:
                deepest = max(DEFAULT_LAYER_FACTORS)
                raise UsageError(f"layers={layers:,}: the grid's default depths reach {deepest:g}x the baseline's, "
                                 f"{max(layer_values):,} layers, past the most a shape may have ({MAX_LAYERS:,}): "
                                 f"give layers up to {int(MAX_LAYERS / deepest):,}, or the depths themselves "
                                 "(--layer-values)")
        self.ratio_values = _sorted_unique(DEFAULT_RATIO_VALUES if ratio_values is None else ratio_values)
        for ratio in self.ratio_values:
            if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and math.isfinite(ratio)
                    and 0 < ratio <= 64):
                raise UsageError(f"d_h/d_model ratio {ratio!r} is invalid: ratios are positive numbers such as 0.4 "
                                 "(at most 64)")
        if not self.k_values or not self.ratio_values or not layer_values:
            raise UsageError("the grid needs at least one value each of K, L and d_h/d_model")
        self.vocab_size, self.tie_embeddings, self.head_dim = vocab_size, bool(tie_embeddings), head_dim
        self.tolerance, self.ratio_tolerance, self.fix = tolerance, ratio_tolerance, fix
        check_positive("hidden_multiple", hidden_multiple, "d_h is a multiple of a positive integer (1, 8, 64 ...)",
                       maximum=MAX_WIDTH)
        self.hidden_multiple = hidden_multiple
        hidden = llama_ffn_hidden(d_model) if ffn_hidden is None else ffn_hidden
        check_positive("ffn_hidden", hidden, maximum=MAX_WIDTH)
        self.reference = uniform(layers, d_model, d_model // head_dim, vocab_size, FFNShape(1, hidden), tie_embeddings)
        self.budget = self.reference.n_params()["total"] if budget is None else budget
        check_positive("budget", self.budget, "a parameter budget is a positive integer such as 113M",
                       maximum=MAX_PARAMS)
        self.kv_groups: tuple[int, ...] = _sorted_unique((1, *kv_groups))
        for g in self.kv_groups:
            check_positive("kv_group", g, "a group size is a positive integer", maximum=MAX_WIDTH)
        check_positive("min_kv_heads", min_kv_heads)
        self.min_kv_heads = min_kv_heads
        self.matchers = {g: BudgetMatcher(self.budget, vocab_size, self.tie_embeddings, head_dim, tolerance,
                                          hidden_multiple, g, min_kv_heads) for g in self.kv_groups}
        self.matcher = self.matchers[1]
        if self.grouped:  # listings show each member's group size and KV cache
            self.table_columns = (*self.table_columns, "kv_group", "kv_cache_bytes_per_token")
        self._baseline = self._solve_baseline()
        if fix:
            self.layer_values: tuple[int, ...] = (self._baseline.n_layers,)
        else:
            self.layer_values = _sorted_unique(layer_values)
            for value in self.layer_values:
                check_positive("layers", value, "grid layer counts are integers >= 1", maximum=MAX_LAYERS)
        points = len(self.k_values) * len(self.layer_values) * (1 if fix else len(self.ratio_values)) * \
            len(self.kv_groups)
        if points > MAX_GRID_POINTS:
            raise UsageError(f"the grid has {points:,} points (K x L x d_h/d_model values): at most "
                             f"{MAX_GRID_POINTS:,}; give fewer --k-values, --layer-values or --ratio-values")

    # ----------------------------------------------------------------- the solver
    def deviation(self, arch: ArchConfig) -> float:
        """Signed relative distance of the exact parameter count from the budget."""
        return self.matcher.deviation(arch)

    @property
    def grouped(self) -> bool:
        """Whether the grid has grouped-query attention (a group size besides 1)."""
        return len(self.kv_groups) > 1

    def solve(self, k: int, layers: int, ratio: float | None, kv_group: int = 1) -> ArchConfig | str:
        """The budget-matched shape of one grid point, or the reason there is none (``ratio`` None: fixed attention,
        the baseline's d_model and L with d_h from the budget)."""
        matcher = self.matchers[kv_group]
        if ratio is None:
            return matcher.solve_fixed(self._baseline.n_layers, self._baseline.d_model, k)
        return matcher.solve(k, layers, ratio, self.ratio_tolerance)

    def _solve_baseline(self) -> ArchConfig:
        ref = self.reference
        if self.budget == ref.n_params()["total"]:
            return ref
        solved = self.matcher.solve(1, ref.n_layers, ref.ffn.hidden / ref.d_model, ratio_tolerance=0.5)
        if isinstance(solved, str):
            raise UsageError(f"no conventional K=1 shape with layers={ref.n_layers} matches the budget "
                             f"{self.budget:,}: {solved}")
        return solved

    @cached_property
    def _solved(self) -> _Solution:
        members: dict[str, tuple[ArchConfig, GridPoint | None]] = {self._baseline.key(): (self._baseline, None)}
        solution = _Solution(members, {}, [])
        for point in self.grid():
            solved = self.solve(point.k, point.layers, point.ratio, point.kv_group)
            if isinstance(solved, str):
                solution.unmatched.append(Unmatched(point, solved))
                continue
            if solved.key() in members:
                first = members[solved.key()][1]
                solution.unmatched.append(Unmatched(point, f"same shape as {first or 'the baseline'}"))
                solved = members[solved.key()][0]
            else:
                members[solved.key()] = (solved, point)
            solution.by_point[point] = solved
        if self.grouped and not any(point.kv_group > 1 for point in solution.by_point):
            misses = [miss for miss in solution.unmatched if miss.point.kv_group > 1]
            raise UsageError(f"no grid point with grouped key/value heads matches the budget {self.budget:,}"
                             + (f" ({misses[0].point}: {misses[0].reason})" if misses else "")
                             + "; give another --budget, --kv-groups or --tolerance")
        return solution

    # ----------------------------------------------------------------- the SearchSpace API
    def grid(self) -> Iterator[GridPoint]:
        """The grid points in order: K, then L, then d_h/d_model, then the group size (ascending)."""
        for k in self.k_values:
            if self.fix:
                yield from (GridPoint(k, self._baseline.n_layers, None, g) for g in self.kv_groups)
                continue
            for layers in self.layer_values:
                for ratio in self.ratio_values:
                    yield from (GridPoint(k, layers, ratio, g) for g in self.kv_groups)

    def baseline(self) -> ArchConfig:
        return self._baseline

    def __iter__(self) -> Iterator[ArchConfig]:
        return (arch for arch, _ in self._solved.members.values())

    def count(self) -> int:
        return len(self._solved.members)

    def unmatched(self) -> list[Unmatched]:
        """Grid points that are not members: no budget match within tolerance, or a duplicate shape."""
        return list(self._solved.unmatched)

    def point_of(self, arch: ArchConfig) -> GridPoint | None:
        """The grid point a member was solved from (None for the baseline)."""
        return self._solved.members[arch.key()][1]

    def validate(self, arch: ArchConfig) -> list[str]:
        if arch.key() in self._solved.members:
            return []
        ref = self._baseline
        reasons = [
            f"{field}={getattr(arch, field)!r} but the space fixes {field}={getattr(ref, field)!r}"
            for field in ("vocab_size", "tie_embeddings", "rope_theta", "norm_eps")
            if getattr(arch, field) != getattr(ref, field)
        ]
        if arch.d_model % self.head_dim:
            reasons.append(f"d_model={arch.d_model} is not a multiple of head_dim={self.head_dim}")
        elif set(arch.heads) != {arch.d_model // self.head_dim}:
            reasons.append(f"hourglass members have d_model/head_dim = {arch.d_model // self.head_dim} heads "
                           "in every layer")
        if len(set(arch.kv_groups())) > 1 or arch.kv_groups()[0] not in self.kv_groups:
            reasons.append(f"key/value heads {format_plateaus(arch.kv_per_layer())}: members share each among "
                           f"one group size of {','.join(map(str, self.kv_groups))} in every layer")
        if abs(self.deviation(arch)) > self.tolerance:
            reasons.append(f"{arch.n_params()['total']:,} parameters is {self.deviation(arch):+.3%} off the budget "
                           f"{self.budget:,} (tolerance ±{self.tolerance:.3%})")
        if self.fix and (arch.d_model, arch.n_layers) != (ref.d_model, ref.n_layers):
            reasons.append(f"fix=attention keeps d_model={ref.d_model} and layers={ref.n_layers}")
        elif arch.n_layers not in self.layer_values and arch.n_layers != ref.n_layers:
            reasons.append(f"layers={arch.n_layers} is not in the grid {list(self.layer_values)}")
        if arch.ffn.k not in self.k_values and arch.ffn.k != 1:
            reasons.append(f"K={arch.ffn.k} is not in the grid {list(self.k_values)}")
        return reasons or ["not the solver's shape for any grid point (one d_model and d_h per point; "
                           "see `nas space list --space hourglass`)"]

    def member_at(self, point: GridPoint) -> ArchConfig:
        """The member solved from ``point``, else the nearest matched point's (keep K, then L, then the ratio)."""
        by_point = self._solved.by_point
        if point in by_point:
            return by_point[point]
        matched = [p for p in self.grid() if p in by_point]
        if not matched:
            return self._baseline

        def distance(p: GridPoint) -> tuple[int, int, int, int]:
            ratios, groups = self.ratio_values, self.kv_groups
            return (abs(groups.index(p.kv_group) - groups.index(point.kv_group)),
                    abs(self.k_values.index(p.k) - self.k_values.index(point.k)),
                    abs(self.layer_values.index(p.layers) - self.layer_values.index(point.layers)),
                    0 if p.ratio is None else abs(ratios.index(p.ratio) - ratios.index(point.ratio)))

        return by_point[min(matched, key=distance)]

    def suggest(self, trial: BaseTrial) -> ArchConfig:
        """Parameters: ``ffn_draw`` in ``[0, count())``, 0 standing for the conventional baseline (one member
        among ``count()``, not one draw in two); for the others ``k`` (categorical over k_values) and,
        unless attention is fixed, ``layers`` and ``d_h_over_d_model`` (categoricals over the grid), and with
        grouped-query attention ``kv_group`` (a categorical over the group sizes). An unmatched point is
        replaced by the nearest matched one (the same group size first)."""
        if trial.suggest_int("ffn_draw", 0, max(0, self.count() - 1)) == 0:
            return self._baseline
        k = trial.suggest_categorical("k", self.k_values)
        if self.fix:
            return self.member_at(GridPoint(k, self._baseline.n_layers, None, self._suggest_group(trial)))
        layers = trial.suggest_categorical("layers", self.layer_values)
        ratio = trial.suggest_categorical("d_h_over_d_model", self.ratio_values)
        return self.member_at(GridPoint(layers=layers, k=k, ratio=ratio, kv_group=self._suggest_group(trial)))

    def _suggest_group(self, trial: BaseTrial) -> int:
        return trial.suggest_categorical("kv_group", self.kv_groups) if self.grouped else 1

    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        self._require_member(arch)
        point = self.point_of(arch)
        if point is None:
            return {"ffn_draw": 0}
        params: dict[str, Any] = {"ffn_draw": 1, "k": point.k}
        if not self.fix:
            params.update(layers=point.layers, d_h_over_d_model=point.ratio)
        if self.grouped:
            params["kv_group"] = point.kv_group
        return params

    def describe(self) -> dict[str, Any]:
        return {
            "space": self.name, "budget": self.budget, "baseline": self._baseline.to_dict(),
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "tie_embeddings": self.tie_embeddings,
            "k_values": list(self.k_values), "layer_values": list(self.layer_values),
            "ratio_values": None if self.fix else list(self.ratio_values),
            "tolerance": self.tolerance, "ratio_tolerance": self.ratio_tolerance, "fix": self.fix,
            "solver": "exact" if self.hidden_multiple == 1 else f"d_h multiple of {self.hidden_multiple}",
            "parametrization": 2,  # 2: the baseline one draw in count() (1: a categorical, one draw in two)
            # grouped-query attention only when asked: the description is part of a study's identity
            **({"kv_groups": list(self.kv_groups), "min_kv_heads": self.min_kv_heads} if self.grouped else {}),
        }

    def row(self, arch: ArchConfig) -> dict[str, Any]:
        p = arch.n_params()
        point = self._solved.members[arch.key()][1] if arch.key() in self._solved.members else None
        return {
            "kind": "baseline" if arch == self._baseline else "hourglass",
            "k": arch.ffn.k, "layers": arch.n_layers, "d_model": arch.d_model, "d_h": arch.ffn.hidden,
            "wider": arch.ffn.wider, "n_heads": arch.heads[0], "head_dim": arch.d_model // arch.heads[0],
            "params": p["total"], "params_embedding": p["embedding"], "params_attention": p["attention"],
            "params_ffn": p["ffn"], "params_norm": p["norm"],
            "budget": self.budget, "budget_deviation": self.deviation(arch),
            "d_model_per_layer": arch.d_model / arch.n_layers, "d_h_over_d_model": arch.ffn.hidden / arch.d_model,
            "grid_ratio": None if point is None else point.ratio,
            **({"kv_group": arch.kv_groups()[0], "kv_heads": list(arch.kv_per_layer()),
                "kv_cache_bytes_per_token": arch.kv_cache_bytes_per_token()} if self.grouped else {}),
            "key": arch.key(),
        }
