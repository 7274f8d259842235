"""Prism Transformer head schedules: non-decreasing staircases of attention-head counts.

Paper: Prism Transformer, progressive attention-head schedules (non-decreasing ``h_1 <= ... <= h_L``; its
grid search found staircases that keep a head dim 2-4 layers and the baseline count in >= L/2 layers).
Exact validity rule (ours), defaults in brackets:

- allowed head counts are the divisors ``h`` of ``d_model`` with ``h <= h_base``; the ones below
  ``h_base`` may be restricted to power-of-two head dims ``d_model / h`` (``hw_aligned``), to
  ``d_model / h >= min_head_dim`` and to ``d_model / h <= max_head_dim`` (256: the head dims
  FlashAttention takes, the GPU presets' default); ``h_base`` itself is always allowed (the
  baseline is a member);
- a schedule splits into maximal runs of equal head count, its *plateaus*;
- the last plateau has ``h_base`` heads and at least ``min_baseline`` [ceil(L/2)] layers;
- every other plateau has ``min_plateau..max_plateau`` [2..4] layers; head counts strictly
  increase from plateau to plateau.

With ``kv_group = g > 1`` (grouped-query attention in every layer, ``search_spaces.kv``) a member's
layers keep ``h_l / g`` key/value heads, so the allowed head counts are also multiples of ``g`` that
leave at least ``min_kv_heads`` key/value heads; ``h_base`` must be one.

Counting without enumerating: a schedule is a prefix of ``P <= L - min_baseline`` layers cut
into ``j`` plateaus of allowed length, carrying ``j`` strictly increasing head counts out of
the ``m`` candidates below ``h_base``, followed by the baseline plateau, so

    count = sum_{P=0}^{L - min_baseline}  sum_j  compositions(P, j) * C(m, j)

where ``compositions(P, j)`` (``j`` parts in ``[min_plateau, max_plateau]``) is a small DP.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import cached_property
from itertools import combinations
from typing import TYPE_CHECKING, Any

from nas.arch import (
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    ArchConfig,
    FFNShape,
    divisors_up_to,
    format_plateaus,
    llama_ffn_hidden,
    parse_plateaus,
    plateaus,
)
from nas.errors import UsageError
from search_spaces.base import Rule, SearchSpace, check_heads, check_positive

if TYPE_CHECKING:
    from optuna.trial import BaseTrial

__all__ = ["PrismSpace", "format_plateaus", "parse_schedule", "plateaus"]


def parse_schedule(text: str) -> tuple[int, ...]:
    """``"3,3,6,6,12,12"`` or the compact ``"3x2,6x2,12x2"`` (head count x layers) -> a head tuple."""
    return parse_plateaus(text, "schedule", "3,3,6,6,12,12 or 3x2,6x2,12x2")


DRAWS_PER_MEMBER = 8  # resolution of the plateau-count draw: each member's share spans at least 8 integers
PARAMETRIZATION = 2  # 2: the plateau count is drawn in proportion to its members (1: uniformly, the baseline 1/4)


# ----------------------------------------------------------------- design rules (search_spaces.base.Rule)
# A schedule's reference count is its last layer's, h_L: the Prism rule makes it the baseline's h_base (in a joint
# study, the uniform count of the shape's own width, which its staircase converges to).
def reduced_layers(shape: ArchConfig, baseline: ArchConfig) -> float:
    """Layers with fewer query heads than the baseline's count at that layer (``h_l < h_L``)."""
    return float(sum(h < shape.heads[-1] for h in shape.heads))


def log2_first_heads(shape: ArchConfig, baseline: ArchConfig) -> float:
    """``log2(h_1 / h_L)``: 0 at the baseline, -2 for a schedule opening with a quarter of its heads."""
    return math.log2(shape.heads[0] / shape.heads[-1])


def prism_steps(shape: ArchConfig, baseline: ArchConfig) -> float:
    """Plateaus below the baseline's count: the staircase's steps (0 at the baseline)."""
    return float(len(plateaus(shape.heads)) - 1)


def mean_log2_heads(shape: ArchConfig, baseline: ArchConfig) -> float:
    """The mean over layers of ``log2(h_l / h_L)``: how far below the baseline's heads the whole schedule sits."""
    return sum(math.log2(h / shape.heads[-1]) for h in shape.heads) / len(shape.heads)


PRISM_RULES = (
    Rule("reduced_layers", "layer", "layers with fewer query heads than the baseline's count at that layer",
         "each layer with fewer heads than the baseline's", 1.0, reduced_layers),
    Rule("log2_first_heads", "doubling of h_1", "log2 of the first layer's heads over the baseline's",
         "halving the first layer's heads", -1.0, log2_first_heads),
    Rule("prism_steps", "step", "plateaus below the baseline's head count (the staircase's steps)",
         "each step of the staircase", 1.0, prism_steps, default=False),
    Rule("mean_log2_heads", "doubling of every layer's heads", "the mean over layers of log2 of h_l over the "
         "baseline's", "halving every layer's heads", -1.0, mean_log2_heads, default=False),
)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class PrismSpace(SearchSpace):
    """Every valid Prism schedule for one ``(L, d_model, h_base)``; the FFN and vocabulary stay fixed."""

    name = "prism"
    table_columns = ("plateaus", "head_dims")
    rules = PRISM_RULES

    def __init__(
        self,
        layers: int,
        d_model: int,
        heads: int,
        *,
        min_plateau: int = 2,
        max_plateau: int = 4,
        min_baseline: int | None = None,  # None: ceil(L/2), the paper's "baseline preservation"
        hw_aligned: bool = False,  # head dims below the baseline's must be powers of two (tensor-core tiles)
        min_head_dim: int | None = None,
        max_head_dim: int | None = None,  # e.g. 256: no layer above FlashAttention's largest head dim
        vocab_size: int = 256,  # byte-level data
        tie_embeddings: bool = True,
        ffn: FFNShape | None = None,  # None: the conventional LLaMA FFN of this d_model
        kv_group: int = 1,  # query heads per key/value head in every layer (1: multi-head attention)
        min_kv_heads: int = 1,  # with kv_group > 1: the fewest key/value heads a layer keeps
    ) -> None:
        check_positive("layers", layers, maximum=MAX_LAYERS)
        check_positive("d_model", d_model, maximum=MAX_WIDTH)
        check_heads(heads, d_model)
        check_positive("min_plateau", min_plateau, "plateaus have at least 1 layer")
        check_positive("max_plateau", max_plateau, "plateaus have at least 1 layer")
        if min_plateau > max_plateau:
            raise UsageError(f"min_plateau={min_plateau} > max_plateau={max_plateau}: choose min_plateau ≤ max_plateau")
        min_baseline = math.ceil(layers / 2) if min_baseline is None else min_baseline
        if not isinstance(min_baseline, int) or not 1 <= min_baseline <= layers:
            raise UsageError(f"min_baseline={min_baseline!r} is invalid for layers={layers}: choose 1..{layers}")
        if min_head_dim is not None:
            check_positive("min_head_dim", min_head_dim)
        if max_head_dim is not None:
            check_positive("max_head_dim", max_head_dim)
        if min_head_dim is not None and max_head_dim is not None and min_head_dim > max_head_dim:
            raise UsageError(f"min_head_dim={min_head_dim} > max_head_dim={max_head_dim}: no head dim is both; choose "
                             "min_head_dim ≤ max_head_dim")
        check_positive("vocab_size", vocab_size, maximum=MAX_VOCAB)
        check_positive("kv_group", kv_group, "the group size is a positive integer")
        check_positive("min_kv_heads", min_kv_heads)
        if kv_group > 1 and (heads % kv_group or heads // kv_group < min_kv_heads):
            raise UsageError(f"group size {kv_group} does not split the baseline's {heads} heads into at least "
                             f"min_kv_heads={min_kv_heads} key/value heads")
        self.kv_group, self.min_kv_heads = kv_group, min_kv_heads
        self.layers, self.d_model, self.h_base = layers, d_model, heads
        self.min_plateau, self.max_plateau, self.min_baseline = min_plateau, max_plateau, min_baseline
        self.hw_aligned, self.min_head_dim, self.max_head_dim = bool(hw_aligned), min_head_dim, max_head_dim
        self.vocab_size, self.tie_embeddings = vocab_size, bool(tie_embeddings)
        self.ffn = ffn or FFNShape(k=1, hidden=llama_ffn_hidden(d_model))
        self.candidates: tuple[int, ...] = tuple(
            h for h in divisors_up_to(d_model, heads - 1) if self._head_dim_reason(h) is None
        )  # head counts allowed below h_base, ascending; plateau ranks index this tuple
        self.prefix_max = layers - min_baseline  # layers available before the baseline plateau
        self.max_plateaus = min(len(self.candidates), self.prefix_max // min_plateau)

    def with_kv_group(self, kv_group: int, min_kv_heads: int = 1, ffn: FFNShape | None = None) -> PrismSpace:
        """This space with ``kv_group`` query heads per key/value head in every layer (and ``ffn``, e.g. the FFN
        that takes the parameters the smaller key/value projections save)."""
        return PrismSpace(self.layers, self.d_model, self.h_base, min_plateau=self.min_plateau,
                          max_plateau=self.max_plateau, min_baseline=self.min_baseline, hw_aligned=self.hw_aligned,
                          min_head_dim=self.min_head_dim, max_head_dim=self.max_head_dim,
                          vocab_size=self.vocab_size, tie_embeddings=self.tie_embeddings, ffn=ffn or self.ffn,
                          kv_group=kv_group, min_kv_heads=min_kv_heads)

    def _head_dim_reason(self, h: int) -> str | None:
        if self.kv_group > 1 and h % self.kv_group:
            return f"{h} heads is not a multiple of the group size {self.kv_group}"
        if self.kv_group > 1 and h // self.kv_group < self.min_kv_heads:
            return (f"{h} heads in groups of {self.kv_group} keep {h // self.kv_group} key/value heads, fewer than "
                    f"min_kv_heads={self.min_kv_heads}")
        head_dim = self.d_model // h
        if self.hw_aligned and not _is_power_of_two(head_dim):
            return f"{h} heads gives head dim {head_dim}, not a power of two (hw_aligned)"
        if self.min_head_dim is not None and head_dim < self.min_head_dim:
            return f"{h} heads gives head dim {head_dim} < min_head_dim={self.min_head_dim}"
        if self.max_head_dim is not None and head_dim > self.max_head_dim:
            return f"{h} heads gives head dim {head_dim} > max_head_dim={self.max_head_dim}"
        return None

    # ----------------------------------------------------------------- members
    def member(self, heads: Sequence[int]) -> ArchConfig:
        """The ``ArchConfig`` of a schedule, with this space's fixed width, FFN and vocabulary."""
        return ArchConfig(
            n_layers=self.layers, d_model=self.d_model, heads=tuple(heads), ffn=self.ffn,
            vocab_size=self.vocab_size, tie_embeddings=self.tie_embeddings,
            kv_heads=tuple(h // self.kv_group for h in heads) if self.kv_group > 1 else (),
        )

    def baseline(self) -> ArchConfig:
        return self.member((self.h_base,) * self.layers)

    def _compositions(self, total: int, parts: int) -> Iterator[tuple[int, ...]]:
        """Ordered ways to write ``total`` as ``parts`` plateau lengths in ``[min_plateau, max_plateau]``."""
        if parts == 0:
            if total == 0:
                yield ()
            return
        for first in range(self.min_plateau, min(self.max_plateau, total) + 1):
            rest = total - first
            if (parts - 1) * self.min_plateau <= rest <= (parts - 1) * self.max_plateau:
                for tail in self._compositions(rest, parts - 1):
                    yield (first, *tail)

    def schedules(self) -> Iterator[tuple[int, ...]]:
        """Every valid schedule once: by prefix length, then plateau count, lengths, head counts."""
        for prefix in range(self.prefix_max + 1):
            baseline_plateau = (self.h_base,) * (self.layers - prefix)
            for parts in range(self.max_plateaus + 1):
                for lengths in self._compositions(prefix, parts):
                    for counts in combinations(self.candidates, parts):
                        steps = tuple(h for h, n in zip(counts, lengths) for _ in range(n))
                        yield steps + baseline_plateau

    def __iter__(self) -> Iterator[ArchConfig]:
        return (self.member(s) for s in self.schedules())

    @cached_property
    def members_by_plateaus(self) -> tuple[int, ...]:
        """How many members have 0, 1, ... ``max_plateaus`` plateaus below the baseline plateau."""
        # ways[p][j]: compositions of p prefix layers into j plateaus of allowed length
        ways = [[0] * (self.max_plateaus + 1) for _ in range(self.prefix_max + 1)]
        ways[0][0] = 1
        for p in range(1, self.prefix_max + 1):
            for j in range(1, self.max_plateaus + 1):
                ways[p][j] = sum(ways[p - n][j - 1] for n in range(self.min_plateau, min(self.max_plateau, p) + 1))
        m = len(self.candidates)
        return tuple(sum(ways[p][j] for p in range(self.prefix_max + 1)) * math.comb(m, j)
                     for j in range(self.max_plateaus + 1))

    @cached_property
    def _count(self) -> int:
        return sum(self.members_by_plateaus)

    def count(self) -> int:
        return self._count

    # ----------------------------------------------------------------- validity
    def validate_schedule(self, heads: Sequence[int]) -> list[str]:
        """Every broken rule of the module docstring, in words; empty when the schedule is valid."""
        heads = list(heads)
        reasons: list[str] = []
        if len(heads) != self.layers:
            reasons.append(f"the schedule has {len(heads)} layers but the space has layers={self.layers}")
        for layer, h in enumerate(heads, start=1):
            if h < 1 or self.d_model % h:
                reasons.append(f"layer {layer}: {h} heads does not divide d_model={self.d_model}")
            elif h > self.h_base:
                reasons.append(f"layer {layer}: {h} heads exceeds the baseline's h_base={self.h_base}")
            elif h < self.h_base and (why := self._head_dim_reason(h)):
                reasons.append(f"layer {layer}: {why}")
            if layer > 1 and h < heads[layer - 2]:
                reasons.append(f"layer {layer}: {h} heads after {heads[layer - 2]} — schedules must not decrease")
        if not heads:
            return reasons
        runs = plateaus(heads)
        last_heads, last_length = runs[-1]
        if last_heads != self.h_base:
            reasons.append(f"the last layer has {last_heads} heads; schedules must end at h_base={self.h_base}")
        elif last_length < self.min_baseline:
            reasons.append(
                f"the baseline plateau ({self.h_base} heads) has {last_length} layers; "
                f"at least min_baseline={self.min_baseline} are required"
            )
        start = 1
        for h, n in runs[:-1]:
            if not self.min_plateau <= n <= self.max_plateau:
                where = f"layer {start}" if n == 1 else f"layers {start}-{start + n - 1}"
                reasons.append(
                    f"{where}: the plateau of {h} heads has {n} layer{'s' * (n != 1)}; plateaus below "
                    f"the baseline need {self.min_plateau}..{self.max_plateau} layers"
                )
            start += n
        return reasons

    def validate(self, arch: ArchConfig) -> list[str]:
        template = self.baseline()
        reasons = [
            f"{field}={getattr(arch, field)!r} but the space fixes {field}={getattr(template, field)!r}"
            for field in ("d_model", "ffn", "vocab_size", "tie_embeddings", "rope_theta", "norm_eps")
            if getattr(arch, field) != getattr(template, field)
        ]
        if set(arch.kv_groups()) != {self.kv_group}:
            reasons.append(f"key/value heads {format_plateaus(arch.kv_per_layer())} but the space has "
                           + ("one per head (multi-head attention)" if self.kv_group == 1 else
                              f"one per {self.kv_group} heads in every layer"))
        return reasons + self.validate_schedule(arch.heads)

    # ----------------------------------------------------------------- sampling
    def draw_resolution(self) -> int:
        """The range of the plateau-count draw: ``DRAWS_PER_MEMBER`` integers per member."""
        return DRAWS_PER_MEMBER * self.count()

    def plateaus_of_draw(self, draw: int, resolution: int) -> int:
        """The plateau count a draw in ``[0, resolution)`` stands for: ``n`` takes the share of the range that its
        members take of the space, so the baseline (``n = 0``) is one member among ``count()``."""
        members, total = self.members_by_plateaus, self.count()
        cumulative = 0
        for n, size in enumerate(members):
            cumulative += size
            if draw * total < cumulative * resolution:
                return n
        return len(members) - 1

    def draw_of_plateaus(self, n: int, resolution: int) -> int:
        """The first draw that stands for ``n`` plateaus (inverse of ``plateaus_of_draw``)."""
        before = sum(self.members_by_plateaus[:n])
        return -(-before * resolution // self.count())

    def suggest_schedule(self, trial: BaseTrial, n_cap: int | None = None, rank_cap: int | None = None,
                         resolution: int | None = None) -> tuple[int, ...]:
        """Sample a valid schedule from learnable parameters, repairing out-of-range ones deterministically.

        Parameters: ``n_plateaus_draw`` in ``[0, resolution)``, standing for a plateau count in proportion
        to its members (``plateaus_of_draw``: drawn uniformly, the baseline comes one draw in ``count()``,
        not one in ``max_plateaus + 1``), and, for plateau ``i`` = 1..n, ``plateau_{i}_len`` in
        ``[min_plateau, max_plateau]`` and ``plateau_{i}_rank`` in ``[0, rank_cap - 1]`` (index into the
        ascending candidate head counts). The caps and the resolution default to this space's own;
        the joint space passes the maxima over all its widths so that ranges never change within a
        study. The repair (clamp the plateau count, shorten lengths that would eat into the baseline
        plateau, push ranks up to keep them strictly increasing) is the identity on valid schedules,
        so ``schedule_params`` inverts it exactly.
        """
        rank_cap = len(self.candidates) if rank_cap is None else rank_cap
        resolution = self.draw_resolution() if resolution is None else resolution
        draw = trial.suggest_int("n_plateaus_draw", 0, resolution - 1)
        n = min(self.plateaus_of_draw(draw, resolution), self.max_plateaus)
        m, used, previous, steps = len(self.candidates), 0, -1, []
        for i in range(1, n + 1):
            left = n - i  # plateaus still to place, each needing min_plateau layers and a higher rank
            length = trial.suggest_int(f"plateau_{i}_len", self.min_plateau, self.max_plateau)
            length = min(length, self.prefix_max - used - left * self.min_plateau)
            rank = trial.suggest_int(f"plateau_{i}_rank", 0, rank_cap - 1)
            rank = min(max(rank, previous + 1), m - 1 - left)
            steps += [self.candidates[rank]] * length
            used, previous = used + length, rank
        return tuple(steps) + (self.h_base,) * (self.layers - used)

    def schedule_params(self, heads: Sequence[int], resolution: int | None = None) -> dict[str, int]:
        """Inverse of ``suggest_schedule`` for a valid schedule."""
        steps = plateaus(heads)[:-1]
        resolution = self.draw_resolution() if resolution is None else resolution
        params = {"n_plateaus_draw": self.draw_of_plateaus(len(steps), resolution)}
        for i, (h, n) in enumerate(steps, start=1):
            params[f"plateau_{i}_len"] = n
            params[f"plateau_{i}_rank"] = self.candidates.index(h)
        return params

    def suggest(self, trial: BaseTrial) -> ArchConfig:
        return self.member(self.suggest_schedule(trial))

    def params_of(self, arch: ArchConfig) -> dict[str, Any]:
        self._require_member(arch)
        return self.schedule_params(arch.heads)

    # ----------------------------------------------------------------- description
    def describe(self) -> dict[str, Any]:
        # max_head_dim only when set: the description is part of a study's identity, and older studies have none
        return {
            "space": self.name, "layers": self.layers, "d_model": self.d_model, "heads": self.h_base,
            "min_plateau": self.min_plateau, "max_plateau": self.max_plateau, "min_baseline": self.min_baseline,
            "hw_aligned": self.hw_aligned, "min_head_dim": self.min_head_dim,
            **({"max_head_dim": self.max_head_dim} if self.max_head_dim is not None else {}),
            **({"kv_group": self.kv_group, "min_kv_heads": self.min_kv_heads} if self.kv_group > 1 else {}),
            "vocab_size": self.vocab_size, "tie_embeddings": self.tie_embeddings,
            "ffn": {"k": self.ffn.k, "hidden": self.ffn.hidden}, "candidates": list(self.candidates),
            "parametrization": PARAMETRIZATION,
        }

    def row(self, arch: ArchConfig) -> dict[str, Any]:
        runs = plateaus(arch.heads)
        return {
            "heads": list(arch.heads),
            "plateaus": format_plateaus(arch.heads),
            "head_dims": list(arch.head_dims()),
            "n_plateaus": len(runs) - 1,  # steps below the baseline plateau
            "baseline_layers": runs[-1][1],
            "is_baseline": len(runs) == 1,
            "layers": arch.n_layers,
            "d_model": arch.d_model,
            "key": arch.key(),
        }
