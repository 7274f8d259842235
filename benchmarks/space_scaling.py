"""Figure 7, space scaling: time to count and to enumerate the prism space as the depth L grows.

``PrismSpace.count()`` is a dynamic programme over (prefix layers, plateaus) with a binomial for
the head counts, so it never enumerates; ``list(space)`` builds every member ``ArchConfig``.
Each is timed on a fresh space (nothing cached), median of repeats. Widths: the GPT-2 small
width (d768, h_base 12: 6 candidate head counts) and the 757M one (d1280, h_base 20: 7).
Target: counting under 0.1 s at every L up to 128.
"""

from __future__ import annotations

import statistics
import time

from benchmarks.harness import BenchConfig, Figure

TARGET_S = 0.1
DEPTHS = (12, 16, 24, 32, 48, 64, 96, 128)
WIDTHS = ((768, 12), (1280, 20))


def _median_seconds(fn, reps: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(reps):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def run(cfg: BenchConfig) -> Figure:
    from search_spaces.prism import PrismSpace

    started = time.perf_counter()
    depths = (12, 128) if cfg.smoke else DEPTHS
    widths = WIDTHS[:1] if cfg.smoke else WIDTHS
    reps = 1 if cfg.smoke else 5
    rows = []
    for d_model, h_base in widths:
        for layers in depths:
            shape = (layers, d_model, h_base)
            count_s, count = _median_seconds(lambda shape=shape: PrismSpace(*shape).count(), reps)
            enum_s, members = _median_seconds(lambda shape=shape: sum(1 for _ in PrismSpace(*shape)),
                                              1 if cfg.smoke else 3)
            assert members == count, f"count {count} != enumerated {members} at L={layers} d={d_model}"
            rows.append({"L": layers, "d_model": d_model, "h_base": h_base, "members": count,
                         "count seconds": count_s, "enumerate seconds": enum_s,
                         "members/s": members / enum_s if enum_s else float("nan")})
    slowest = max(rows, key=lambda r: r["count seconds"])
    return Figure(
        number=7, name="space_scaling", title="Space scaling: counting and enumerating the prism space",
        target=f"count < {TARGET_S} s for L = 12 ... 128",
        method=("PrismSpace(L, d_model, h_base) with default rules (plateaus 2-4 layers, baseline plateau >= L/2); "
                "count = construct + count() on a fresh instance (DP, no enumeration); enumerate = iterate every "
                f"member ArchConfig; medians of {reps} repeats; enumeration is checked against the count"),
        columns=["L", "d_model", "h_base", "members", "count seconds", "enumerate seconds", "members/s"],
        rows=rows, passed=all(r["count seconds"] < TARGET_S for r in rows),
        summary=f"slowest count {slowest['count seconds'] * 1e3:.2f} ms (L={slowest['L']}, d{slowest['d_model']}); "
                f"largest space {max(r['members'] for r in rows):,} members enumerated in "
                f"{max(r['enumerate seconds'] for r in rows):.2f} s",
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
