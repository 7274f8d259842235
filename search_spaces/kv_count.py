"""How many (Prism schedule, key/value group schedule) pairs a grouped Prism space holds, counted without listing.

The two schedules are read layer by layer as one automaton: a Prism layer has a head count ``h`` and the length
its plateau has reached; a key/value layer has a group size ``g``, its plateau's length, and whether an earlier
plateau ended (``KVRule._next``). A layer's group sizes depend only on its head count (``KVRule.allows``). Both
lengths are capped where the rules stop telling them apart (``Caps``).

Two walks count the same automaton:

- ``count_by_states``: one dictionary entry per reachable state, moved one at a time. Fast while the plateau
  lengths are short (the default spaces: a few dozen states a block).
- ``count_by_tables``: one table per ``(h, g, ended)`` block, indexed by the two lengths (rows: the head plateau,
  columns: the key/value one); a layer moves whole rows and columns: a plateau that goes on shifts them by one
  (the last index gathering every longer run), one that ends sums them into the first row or column of the next
  block. With plateau limits well below the depth (100 of 128 layers) a block holds about 100 x 100 states: the
  first walk took 45 s there, this one 4 s. Its counts are Python integers (numpy's object arrays): a deep space
  holds more members than 64 bits count.

``count_over_prism`` takes the tables from ``TABLE_CELLS`` states a block (the two cross near 50 on a 2-core
Intel Xeon); ``tests/test_gqa_space.py`` checks that both give the same counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from search_spaces.kv import START, State

if TYPE_CHECKING:
    from search_spaces.kv import KVRule
    from search_spaces.prism import PrismSpace

TABLE_CELLS = 64  # states a block (head lengths x key/value lengths) from which the tables count faster
Block = tuple[int, int, bool]  # (head count, group size, an earlier key/value plateau ended)


@dataclass(frozen=True)
class Caps:
    """Where each plateau length stops mattering.

    A plateau whose longest allowed length no schedule that ends valid can pass only needs counting up to its
    shortest: every longer run allows the same moves. A plateau below h_base ends at least ``min_baseline`` layers
    before the depth (the h_base plateau follows); a key/value plateau that is not the last, at least the
    key/value ``min_plateau`` before it. Without the caps, plateaus up to 4,096 layers made the states grow with
    the depth and the count cubic in it (59 s at 128 layers)."""

    head: int  # a plateau below h_base
    base: int  # the h_base plateau: min_baseline
    kv: int  # a key/value plateau: max_plateau + 1 (too long to end) unless no plateau can get there

    @classmethod
    def of(cls, rule: KVRule, prism: PrismSpace) -> Caps:
        head_free = prism.max_plateau >= prism.layers - prism.min_baseline
        kv_free = rule.max_plateau >= prism.layers - rule.min_plateau
        return cls(head=prism.min_plateau if head_free else prism.max_plateau, base=prism.min_baseline,
                   kv=rule.min_plateau if kv_free else rule.max_plateau + 1)

    @property
    def cells(self) -> int:
        return max(self.head, self.base) * self.kv


def count_over_prism(rule: KVRule, prism: PrismSpace) -> int:
    """Members (Prism schedule, group schedule) of ``prism`` under ``rule``, counted without listing them.

    Prism: a layer starts at any candidate or ``h_base``; a plateau below ``h_base`` lasts ``min_plateau ..
    max_plateau`` layers and is followed by a larger count; the ``h_base`` plateau lasts to the end and needs
    ``min_baseline`` layers. Key/value (``KVRule``): group sizes never decrease; a plateau that ends lasted
    ``min_plateau .. max_plateau`` layers, the last at least ``min_plateau`` unless it is the only one.
    """
    if not rule.schedule:
        return sum(prism.with_kv_group(g, rule.min_kv_heads).count() for g in rule.groups
                   if rule.allows(prism.h_base, g))
    caps = Caps.of(rule, prism)
    walk = count_by_tables if caps.cells >= TABLE_CELLS else count_by_states
    return walk(rule, prism, caps)


def count_by_states(rule: KVRule, prism: PrismSpace, caps: Caps) -> int:
    """The automaton walked one reachable state at a time (module docstring)."""
    base, counts = prism.h_base, (*prism.candidates, prism.h_base)

    def head_moves(state: tuple[int, int] | None) -> Iterator[tuple[int, int]]:
        if state is None:
            yield from ((h, 1) for h in counts)
            return
        h, run = state
        if h == base:
            yield base, min(run + 1, caps.base)
            return
        if run < prism.max_plateau:
            yield h, min(run + 1, caps.head)
        if run >= prism.min_plateau:
            yield from ((higher, 1) for higher in counts if higher > h)

    layer_states: dict[tuple[tuple[int, int] | None, State], int] = {(None, START): 1}
    for _ in range(prism.layers):
        following: dict[tuple[tuple[int, int] | None, State], int] = {}
        for (head_state, kv_state), n in layer_states.items():
            for head_after in head_moves(head_state):
                for _, (g, run, ended) in rule._next(kv_state, head_after[0]):
                    key = (head_after, (g, min(run, caps.kv), ended))
                    following[key] = following.get(key, 0) + n
        layer_states = following
    return sum(n for (head_state, kv_state), n in layer_states.items()
               if head_state is not None and head_state[0] == base and head_state[1] >= caps.base
               and rule._accepts(kv_state))


def _longer(table: np.ndarray, axis: int, cap: int, limit: int | None) -> np.ndarray:
    """Each plateau along ``axis`` one layer longer: index ``i`` (a plateau of ``i + 1`` layers) moves to
    ``min(i + 1, cap - 1)``; a plateau already ``limit`` layers long cannot go on (dropped here)."""
    moved = table if axis == 0 else table.T
    out = np.zeros_like(moved)
    keep = moved.shape[0] if limit is None else min(moved.shape[0], limit - 1)  # lengths 1 .. limit - 1 go on
    below = min(keep, cap - 1)  # these land on distinct indexes 1 .. below
    out[1:below + 1] += moved[:below]
    if keep > cap - 1:  # the rest gathers at the cap
        out[cap - 1] += moved[cap - 1:keep].sum(axis=0)
    return out if axis == 0 else out.T


def count_by_tables(rule: KVRule, prism: PrismSpace, caps: Caps) -> int:
    """The automaton walked a block of states at a time (module docstring)."""
    base, counts = prism.h_base, (*prism.candidates, prism.h_base)
    shape = (max(caps.head, caps.base), caps.kv)
    tables: dict[Block, np.ndarray] = {}

    def table_of(block: Block) -> np.ndarray:
        if block not in tables:
            tables[block] = np.zeros(shape, dtype=object)  # Python integers: exact past 64 bits
        return tables[block]

    for h in counts:  # the first layer: any head count, any group size it allows
        for g in rule.allowed(h):
            table_of((h, g, False))[0, 0] += 1
    for _ in range(prism.layers - 1):
        previous, tables = tables, {}
        for (h, g, ended), table in previous.items():
            if h == base:  # the h_base plateau goes on to the end
                heads = [(_longer(table, 0, caps.base, None), (base,))]
            else:
                stepped = np.zeros(shape, dtype=object)
                stepped[0] = table[prism.min_plateau - 1:].sum(axis=0)  # plateaus long enough to end
                heads = [(_longer(table, 0, caps.head, prism.max_plateau), (h,)),
                         (stepped, tuple(higher for higher in counts if higher > h))]
            for moved, heads_after in heads:  # each key/value move made once for every head count it leads to
                same = _longer(moved, 1, caps.kv, None)
                ending = moved[:, rule.min_plateau - 1:rule.max_plateau].sum(axis=1)  # plateaus that may end
                for h_after in heads_after:
                    allowed = rule.allowed(h_after)
                    if g in allowed:
                        table_of((h_after, g, ended))[:] += same
                    for larger in allowed:
                        if larger > g:
                            table_of((h_after, larger, True))[:, 0] += ending
    # h_base for at least min_baseline layers; a last key/value plateau after others at least min_plateau long
    return sum(int(table[caps.base - 1, (rule.min_plateau - 1 if ended else 0):].sum())
               for (h, _, ended), table in tables.items() if h == base)
