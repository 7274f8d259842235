"""The live progress display of ``nas search``: one line per finished trial, with best, gain and ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from nas.study.config import display_url
from nas.study.session import Search
from nas.study.worker import TrialEvent
from nas.units import format_duration


class Progress:
    """One line per trial, e.g.::

        [ 37/200] #41 member  h=3x2,6x2,12x8 ... loss 3.2871 (9.4s) | best 3.2512 #7 (+1.25% vs baseline) | ETA 28m10s
    """

    def __init__(self, workers: int = 1, stream: TextIO | None = None) -> None:
        # resolved now, not at import: a default of sys.stderr would pin whatever stream was current then
        self.stream, self.workers = stream or sys.stderr, workers
        self.started = time.perf_counter()
        self.first_counted: int | None = None

    def start(self, search: Search) -> None:
        c = search.config
        then = (f"then a race of the baseline and the {c.race_size} best" if c.replicates == "race"
                else "then seed replicates")
        mode = f"exhaustive walk, {then}" if search.exhaustive else f"{c.sampler or 'default'} sampler"
        self.print(f"study {c.study_name!r} in {display_url(c.storage)}: {c.space.space} space of "
                   f"{search.space.count()} shapes "
                   f"({mode}); preset {c.preset} ({search.train.tokens} tokens/trial, {search.train.device}); "
                   f"data {search.data.name} ({len(search.data.train)} train tokens); target {c.trials} trials")

    def __call__(self, e: TrialEvent) -> None:
        if self.first_counted is None:
            self.first_counted = e.counted - (e.state not in ("duplicate", "error", "interrupted", "surplus"))
        value = f"loss {e.value:.4f}" if e.value is not None else e.state
        line = f"[{e.counted:>{len(str(e.target))}}/{e.target}] #{e.number} {e.role:<9} {e.arch.label()} "
        line += f"seed {e.seed}: "
        line += f"{value} ({e.state}, {e.wall_time_s:.1f}s)"
        if e.reason and e.state not in ("complete", "duplicate"):
            line += f" [{e.reason}]"
        if e.best is not None:
            line += f" | best {e.best[1]:.4f} #{e.best[0]}"
            if e.baseline:
                line += f" ({100 * (e.baseline - e.best[1]) / e.baseline:+.2f}% vs baseline {e.baseline:.4f})"
        done_here = e.counted - (self.first_counted or 0)
        if done_here > 0 and e.counted < e.target:
            rate = (time.perf_counter() - self.started) / done_here
            line += f" | ETA {format_duration(rate * (e.target - e.counted))}"
        self.print(line)

    def print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
