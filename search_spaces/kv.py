"""Grouped-query attention as a search axis: which key/value heads each layer of a member keeps.

GQA (Ainslie et al. 2023) gives layer ``l`` ``kv_l`` key/value heads, each shared by a *group* of
``g_l = h_l / kv_l`` query heads (``g = 1``: multi-head attention, ``g = h_l``: multi-query). Its W_K and
W_V shrink from ``d x d`` to ``kv_l d_head_l x d`` and its KV cache by ``g_l``. The rule (ours), options of
``nas space`` and ``nas search`` in brackets:

- the candidate group sizes are ``--kv-groups`` (default, with ``--kv-schedule``: every divisor of the
  baseline's ``h_base`` that leaves ``--min-kv-heads``), each dividing ``h_base``; 1 is always one of
  them, so a GQA space holds every member of the space without GQA, the baseline first;
- a layer may take group size ``g`` when ``g`` divides its head count and, for ``g > 1``, leaves at least
  ``--min-kv-heads`` [1] key/value heads;
- *uniform* (``--kv-groups`` alone): one group size in every layer;
- *schedule* (``--kv-schedule``): group sizes non-decreasing with depth (deeper layers share more), in
  plateaus (maximal runs of one group size) of ``--kv-min-plateau..--kv-max-plateau`` [2..4] layers,
  except the deepest, which has at least ``--kv-min-plateau`` and no upper bound; a one-plateau
  schedule (uniform) is always valid.

Counting a schedule space without enumerating it: for one head sequence, a dynamic programme over
the layers whose state is (this layer's group size, the length of its plateau so far, capped at
``max_plateau + 1``, whether a plateau ended before); over all Prism schedules at once, the same
programme run on pairs of that state and the Prism schedule's own state (head count, plateau length),
since a layer's allowed group sizes depend only on its head count (``search_spaces.kv_count``).

Imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from nas.arch import MAX_LAYERS, divisors_up_to, format_plateaus, parse_plateaus, plateaus
from nas.errors import UsageError
from search_spaces.base import Rule, check_positive

if TYPE_CHECKING:
    from nas.arch import ArchConfig

State = tuple[int, int, bool]  # (group size, layers of its plateau so far capped at max_plateau + 1, a plateau ended)
START: State = (0, 0, False)
DRAWS_PER_MEMBER = 8  # as search_spaces.prism: each schedule's share of the kv_draw range spans at least 8 integers


def log2_kv_group(shape: ArchConfig, baseline: ArchConfig) -> float:
    """The mean over layers of ``log2 g_l``, ``g_l = h_l / kv_l`` query heads per key/value head (0: multi-head)."""
    return sum(math.log2(g) for g in shape.kv_groups()) / shape.n_layers


GQA_RULES = (
    Rule("log2_kv_group", "doubling of the group size", "the mean over layers of log2 of query heads per key/value "
         "head", "each doubling of the query heads per key/value head", 1.0, log2_kv_group),
)


def parse_kv_schedule(text: str, layers: int) -> tuple[int, ...]:
    """``"4,4,2,2"`` or ``"4x6,2x6"`` (key/value heads x layers) -> one count per layer; ``UsageError`` for another
    length or an item that is no count."""
    counts = parse_plateaus(text, "--kv", "4,4,2,2 or 4x6,2x6")
    if len(counts) != layers:
        raise UsageError(f"--kv {text!r} gives {len(counts)} layers but the shape has {layers}: give one key/value "
                         "head count per layer")
    return tuple(counts)


@dataclass(frozen=True)
class KVRule:
    """Which group sizes ``g_l = h_l / kv_l`` a member's layers may take (module docstring)."""

    groups: tuple[int, ...]  # candidate group sizes, ascending, 1 first
    schedule: bool = False  # False: one group size in every layer; True: a non-decreasing schedule of them
    min_kv_heads: int = 1  # a grouped layer (g > 1) keeps at least this many key/value heads
    min_plateau: int = 2
    max_plateau: int = 4

    @classmethod
    def build(cls, h_base: int, groups: Sequence[int] | None, schedule: bool = False, min_kv_heads: int | None = None,
              min_plateau: int | None = None, max_plateau: int | None = None) -> KVRule:
        """The rule the options give, checked against the baseline's head count ``h_base`` (one-line errors)."""
        valid = ",".join(map(str, divisors_up_to(h_base, h_base)))
        for g in groups or ():
            check_positive("--kv-groups", g, "a group size is a positive integer (query heads per key/value head)")
            if g > h_base:
                raise UsageError(f"group size {g} is larger than the baseline's {h_base} heads; valid group sizes "
                                 f"are {valid}")
            if h_base % g:
                raise UsageError(f"group size {g} does not divide the baseline's {h_base} heads; valid group sizes "
                                 f"are {valid}")
        min_kv = 1 if min_kv_heads is None else min_kv_heads
        check_positive("--min-kv-heads", min_kv, "give the fewest key/value heads a grouped layer keeps (>= 1)")
        default = [g for g in divisors_up_to(h_base, h_base) if h_base // g >= min_kv]  # what min_kv leaves
        chosen = tuple(sorted({1, *(groups or default)}))
        for g in chosen[1:]:
            if h_base // g < min_kv:
                fits = ",".join(str(x) for x in divisors_up_to(h_base, h_base) if x == 1 or h_base // x >= min_kv)
                raise UsageError(f"group size {g} leaves the baseline's {h_base} heads {h_base // g} key/value heads, "
                                 f"fewer than --min-kv-heads {min_kv}; valid group sizes are {fits}")
        low = 2 if min_plateau is None else min_plateau
        high = 4 if max_plateau is None else max_plateau
        check_positive("--kv-min-plateau", low, "plateaus have at least 1 layer", maximum=MAX_LAYERS)
        check_positive("--kv-max-plateau", high, "plateaus have at least 1 layer", maximum=MAX_LAYERS)
        if low > high:
            raise UsageError(f"--kv-min-plateau {low} > --kv-max-plateau {high}: choose min <= max")
        return cls(chosen, schedule, min_kv, low, high)

    def describe(self) -> dict[str, Any]:
        """The rule as stored in a study's identity (only spaces with GQA options carry it)."""
        out: dict[str, Any] = {"kv_groups": list(self.groups), "kv_mode": "schedule" if self.schedule else "uniform",
                               "min_kv_heads": self.min_kv_heads}
        if self.schedule:
            out.update(kv_min_plateau=self.min_plateau, kv_max_plateau=self.max_plateau)
        return out

    # ----------------------------------------------------------------- one layer
    def allows(self, heads: int, g: int) -> bool:
        """Whether a layer of ``heads`` heads may take group size ``g``."""
        return heads % g == 0 and (g == 1 or heads // g >= self.min_kv_heads)

    def allowed(self, heads: int) -> tuple[int, ...]:
        return tuple(g for g in self.groups if self.allows(heads, g))

    # ----------------------------------------------------------------- schedules of one head sequence
    def _next(self, state: State, heads: int) -> Iterator[tuple[int, State]]:
        """(group size, state after the layer) for each way a layer of ``heads`` heads can follow ``state``,
        in ascending group size."""
        g, run, ended = state
        for new in self.allowed(heads):
            if state == START:
                yield new, (new, 1, False)
            elif new == g:
                yield new, (g, min(run + 1, self.max_plateau + 1), ended)
            elif new > g and self.min_plateau <= run <= self.max_plateau:
                yield new, (new, 1, True)

    def _accepts(self, state: State) -> bool:
        """A schedule may end here: one plateau of any length, or a last plateau of at least ``min_plateau``."""
        return state != START and (not state[2] or state[1] >= self.min_plateau)

    def _ways(self, heads: tuple[int, ...]) -> list[dict[State, int]]:
        """``ways[l][s]``: the valid completions of layers ``l ..`` after state ``s`` (a backward programme)."""
        ways: list[dict[State, int]] = [{} for _ in range(len(heads) + 1)]
        states: list[set[State]] = [{START}]
        for h in heads:  # the states reachable before each layer
            states.append({after for state in states[-1] for _, after in self._next(state, h)})
        ways[len(heads)] = {s: int(self._accepts(s)) for s in states[-1]}
        for layer in range(len(heads) - 1, -1, -1):
            ways[layer] = {s: sum(ways[layer + 1][after] for _, after in self._next(s, heads[layer]))
                           for s in states[layer]}
        return ways

    def group_schedules(self, heads: Sequence[int]) -> Iterator[tuple[int, ...]]:
        """Every valid group-size sequence for ``heads``, ascending lexicographically (multi-head first)."""
        heads = tuple(heads)
        if not self.schedule:
            for g in self.groups:
                if all(self.allows(h, g) for h in heads):
                    yield (g,) * len(heads)
            return
        ways = self._ways(heads)

        def choices(layer: int, state: State) -> Iterator[tuple[int, State]]:
            """The group sizes layer ``layer`` may take after ``state`` that some valid schedule completes."""
            return ((g, after) for g, after in self._next(state, heads[layer]) if ways[layer + 1].get(after))

        # a depth-first walk with its own stack (``stack[l]``: the choices left at layer ``l``), not recursion:
        # a space may be MAX_LAYERS deep, past Python's recursion limit
        prefix: list[int] = []
        stack = [choices(0, START)]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                if prefix:
                    prefix.pop()
                continue
            g, after = step
            prefix.append(g)
            if len(prefix) == len(heads):
                yield tuple(prefix)
                prefix.pop()
            else:
                stack.append(choices(len(prefix), after))

    def kv_schedules(self, heads: Sequence[int]) -> Iterator[tuple[int, ...]]:
        """``group_schedules`` as key/value head counts ``h_l / g_l``."""
        for groups in self.group_schedules(heads):
            yield tuple(h // g for h, g in zip(heads, groups))

    def count(self, heads: Sequence[int]) -> int:
        heads = tuple(heads)
        if not self.schedule:
            return sum(all(self.allows(h, g) for h in heads) for g in self.groups)
        return _cached_ways(self, heads)[0][START]

    def unrank(self, heads: Sequence[int], index: int) -> tuple[int, ...]:
        """The ``index``-th (0-based) of ``group_schedules(heads)``, without listing the ones before it."""
        heads = tuple(heads)
        if not self.schedule:
            return list(self.group_schedules(heads))[index]
        ways, state, out = _cached_ways(self, heads), START, []
        for layer, h in enumerate(heads):
            for g, after in self._next(state, h):
                n = ways[layer + 1].get(after, 0)
                if index < n:
                    out.append(g)
                    state = after
                    break
                index -= n
        return tuple(out)

    def rank(self, heads: Sequence[int], groups: Sequence[int]) -> int:
        """Inverse of ``unrank`` for a valid group-size sequence."""
        heads, groups = tuple(heads), tuple(groups)
        if not self.schedule:
            return list(self.group_schedules(heads)).index(groups)
        ways, state, index = _cached_ways(self, heads), START, 0
        for layer, (h, chosen) in enumerate(zip(heads, groups)):
            for g, after in self._next(state, h):
                if g == chosen:
                    state = after
                    break
                index += ways[layer + 1].get(after, 0)
        return index

    def validate(self, heads: Sequence[int], kv_heads: Sequence[int]) -> list[str]:
        """Every reason ``kv_heads`` is not a key/value schedule of this rule for ``heads``, in words."""
        reasons = []
        if len(kv_heads) != len(heads):
            return [f"the key/value schedule has {len(kv_heads)} layers but the shape has {len(heads)}"]
        for layer, (h, n) in enumerate(zip(heads, kv_heads), start=1):
            if n < 1 or h % n:
                reasons.append(f"layer {layer}: {n} key/value heads does not divide its {h} heads")
            elif h // n not in self.groups:
                reasons.append(f"layer {layer}: group size {h // n} ({h} heads on {n}) is not one of the group "
                               f"sizes {','.join(map(str, self.groups))}")
            elif not self.allows(h, h // n):
                reasons.append(f"layer {layer}: {n} key/value heads is fewer than min_kv_heads={self.min_kv_heads}")
        if reasons:
            return reasons
        groups = [h // n for h, n in zip(heads, kv_heads)]
        if not self.schedule:
            return [] if len(set(groups)) == 1 else [
                f"group sizes {format_plateaus(groups)} differ by layer: this space takes one group size in every "
                "layer (--kv-schedule for a schedule)"]
        runs = plateaus(groups)
        start = 1
        for i, (g, n) in enumerate(runs):
            if i and g < runs[i - 1][0]:
                reasons.append(f"layer {start}: group size {g} after {runs[i - 1][0]} — group sizes must not "
                               "decrease with depth")
            last = i == len(runs) - 1
            if len(runs) > 1 and (n < self.min_plateau or (not last and n > self.max_plateau)):
                where = f"layer {start}" if n == 1 else f"layers {start}-{start + n - 1}"
                need = f"at least {self.min_plateau}" if last else f"{self.min_plateau}..{self.max_plateau}"
                reasons.append(f"{where}: the plateau of group size {g} has {n} layer{'s' * (n != 1)}; it needs "
                               f"{need}")
            start += n
        return reasons

    def draw_resolution(self, max_layers: int) -> int:
        """The range of ``kv_draw``: ``DRAWS_PER_MEMBER`` integers per schedule of the most schedules any head
        sequence of up to ``max_layers`` layers can have (every group size allowed in every layer), so the
        range is one for a whole study."""
        if not self.schedule:
            return len(self.groups)
        return DRAWS_PER_MEMBER * max(1, max(_unconstrained_counts(self, max_layers)))


@lru_cache(maxsize=4096)
def _cached_ways(rule: KVRule, heads: tuple[int, ...]) -> list[dict[State, int]]:
    return rule._ways(heads)


def _unconstrained_counts(rule: KVRule, max_layers: int) -> list[int]:
    """Schedules of every length 1 .. ``max_layers`` when each layer may take every group size."""
    top = max(rule.groups) * max(rule.min_kv_heads, 1)
    heads = [top * math.lcm(*rule.groups)] * max_layers  # a head count every group size divides, with heads to spare
    states: dict[State, int] = {START: 1}
    counts = []
    for h in heads:
        following: dict[State, int] = {}
        for state, n in states.items():
            for _, after in rule._next(state, h):
                following[after] = following.get(after, 0) + n
        states = following
        counts.append(sum(n for s, n in states.items() if rule._accepts(s)))
    return counts
