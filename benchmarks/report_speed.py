"""Figure 8, report speed: ``nas report`` on SQLite studies of 200 and 1,000 trials, and the page's size.

Studies are synthetic (``benchmarks.synthetic_studies``: the attrs, params and curves a real
search writes, no training) in a fresh SQLite file opened the way ``nas report`` opens it
(``open_existing_study``, read-only). Timed: reading the study into frames (``read_study``) and
building and writing the page (``write_report``), best of repeats; the reference in the same
run is Optuna's own read of the trials (``study.get_trials()``), so the ratio says how much the
report adds to reading the storage. Target: 1,000 trials in under 60 s.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.harness import BenchConfig, Figure

TARGET_S = 60.0
SIZES = (200, 1000)


def _best_of(fn, reps: int) -> tuple[float, object]:
    best, value = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def run(cfg: BenchConfig) -> Figure:
    import optuna

    from benchmarks.synthetic_studies import SyntheticSpec, synthetic_study
    from nas.study.existing import open_existing_study
    from nas.study.storage import make_storage
    from reports.frame import read_study
    from reports.html import write_report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    rows = []
    reps = 1 if cfg.smoke else 3
    with tempfile.TemporaryDirectory(prefix="nas-report-bench-") as folder:
        for size in (60,) if cfg.smoke else SIZES:
            url = f"sqlite:///{Path(folder) / f'study{size}.db'}"
            synthetic_study(SyntheticSpec(space="joint", trials=size, seed=cfg.seed), storage=make_storage(url),
                            name="bench")
            study, _ = open_existing_study(url, "bench")
            read_s, _ = _best_of(lambda study=study: study.get_trials(deepcopy=False), reps)
            frame_s, data = _best_of(lambda study=study: read_study(study), reps)
            out = Path(folder) / f"report{size}.html"
            page_s, _ = _best_of(lambda data=data, out=out: write_report(data, out), reps)
            total = frame_s + page_s
            rows.append({"trials": len(data.trials), "storage read s": read_s, "frames s": frame_s,
                         "page s": page_s, "report s": total, "report / storage read": total / read_s,
                         "file MB": out.stat().st_size / 2**20, "target s": TARGET_S})
    largest = rows[-1]
    return Figure(
        number=8, name="report_speed", title="Report speed: nas report on 200 and 1,000 trials",
        target=f"< {TARGET_S:.0f} s for 1,000 trials",
        method=("synthetic joint-space studies (benchmarks.synthetic_studies) in SQLite, opened read-only as nas "
                "report opens them; report = read_study + write_report (plotly.js inline), best of "
                f"{reps}; reference: Optuna's study.get_trials() on the same storage"),
        columns=["trials", "storage read s", "frames s", "page s", "report s", "report / storage read", "file MB",
                 "target s"],
        rows=rows, passed=largest["report s"] < TARGET_S,
        summary=f"{largest['trials']} trials in {largest['report s']:.1f} s ({largest['file MB']:.1f} MB); "
                + ", ".join(f"{r['trials']}: {r['report s']:.1f} s" for r in rows),
        seconds=time.perf_counter() - started, smoke=cfg.smoke)
