"""The live progress display of ``nas search``: one line per finished trial, with best, gain and ETA."""

from __future__ import annotations

import sys
import time
from statistics import median
from typing import TextIO

from nas.errors import printable
from nas.study.config import display_url
from nas.study.records import counts
from nas.study.session import Search
from nas.study.worker import TrialEvent
from nas.units import format_duration

ESTIMATE_AFTER = 4  # trainings of this run, after each worker's first, behind the one-off time estimate
TRAINED_STATES = ("complete", "pruned", "diverged", "oom")  # the events that count a training


def estimate_text(seconds_per_trial: float, left: int, workers: int, source: str) -> str:
    """``about 5.4 s a trial (median of ...), 1 worker: the 197 trials left take about 17m44s``."""
    per_worker = f"{workers} workers" if workers > 1 else "1 worker"
    return (f"about {seconds_per_trial:.1f} s a trial ({source}), {per_worker}: the {left} trials left take about "
            f"{format_duration(seconds_per_trial * left / workers)}")


def rate_text(seconds_per_trial: float, left: int, workers: int, trainings: int, pace: bool = False) -> str:
    """``a trial every 1.6 s (the median of this run's trainings 3-6 on this machine, over 2 workers: ...): the 194
    trials left take about 5m10s``; ``pace``: from the time between those trainings ending (workers on several
    devices)."""
    first = workers + 1
    span = f"this run's trainings {first}-{first + trainings - 1} on this machine"
    if pace:
        basis = f"the time between {span} ending, the {workers} workers on several devices together"
    else:
        basis = f"the median of {span}" + (f", over {workers} workers" if workers > 1 else "")
    return (f"a trial every {seconds_per_trial:.1f} s ({basis}: each worker's first, with its one-off start, left "
            f"out): the {left} trials left take about {format_duration(seconds_per_trial * left)}")


def placement_text(placements: list) -> str:
    """``1 worker on cpu (2 threads)`` or ``8 workers on cuda:0, cuda:1, ... (4 threads each)``."""
    if not placements:
        return "1 worker"
    devices = ", ".join(dict.fromkeys(p.label for p in placements))
    n, threads = len(placements), placements[0].threads
    return (f"{n} worker{'s' if n > 1 else ''} on {devices} ({threads} thread{'s' if threads > 1 else ''}"
            f"{' each' if n > 1 else ''})")


def replicates_text(replicates: str, race_size: int, shapes: int) -> str:
    """What follows an exhaustive walk, as the first line says it: a race names the shapes that can race (at most
    the space's shapes besides the baseline, however large ``--race-size``)."""
    if replicates == "race":
        racers = min(race_size, max(0, shapes - 1))
        return f"then a race of the baseline and the {racers} best" if racers != 1 \
            else "then a race of the baseline and the best shape"
    return {"adaptive": "then adaptive replicates (knowledge gradient)",
            "adaptive-answer": "then adaptive replicates (knowledge gradient and the answer's sentence)",
            }.get(replicates, "then seed replicates")


class Progress:
    """One line per trial, e.g.::

        [ 37/200] #41 member  h=3x2,6x2,12x8 ... loss 3.2871 (9.4s) | best 3.2512 #7 (+1.25% vs baseline) | ETA 28m10s
    """

    def __init__(self, workers: int = 1, stream: TextIO | None = None, clock=time.perf_counter) -> None:
        # resolved now, not at import: a default of sys.stderr would pin whatever stream was current then
        self.stream, self.workers, self.clock = stream or sys.stderr, workers, clock
        self.started = clock()
        self.first_counted: int | None = None
        self.walls: list[float] = []  # this run's trainings' wall times, in the order they ended, until the estimate
        self.arrivals: list[float] = []  # ... and when they ended
        self.devices = 1  # the workers' devices (start: from the placements)
        self.estimated = False
        self.notes_shown = 0  # the search's notes already printed (at the start: a resumed study's policy)

    def start(self, search: Search) -> None:
        c = search.config
        self.workers = len(search.placements) or self.workers
        self.devices = len({p.label for p in search.placements}) or 1
        shapes = search.space.count()
        then = replicates_text(c.replicates, c.race_size, shapes)
        mode = f"exhaustive walk, {then}" if search.exhaustive else f"{c.sampler or 'default'} sampler"
        self.print(f"study {c.study_name!r} in {display_url(c.storage)}: {c.space.space} space of "
                   f"{shapes} shapes "
                   f"({mode}); preset {c.preset} ({search.train.tokens} tokens/trial, {search.train.device}); "
                   f"data {printable(search.data.name)} ({len(search.data.train)} train tokens); "
                   f"target {c.trials} trials{self._resumed_text(search)}; "
                   f"{placement_text(search.placements)}; " + self._stored_estimate(search))
        for note in search.notes:
            self.print(f"note: {note}")
        self.notes_shown = len(search.notes)

    @staticmethod
    def _resumed_text(search: Search) -> str:
        """``, resumed: N trained already`` when the study holds trials that ``--trials`` counts, else ``, none
        trained yet``: the first line said neither, so an option mistyped on resume, which starts a new study, looked
        like the resume."""
        trained = sum(counts(t) for t in search.study.get_trials(deepcopy=False))
        return f", resumed: {trained:,} trained already" if trained else ", none trained yet"

    def _stored_estimate(self, search: Search) -> str:
        """The time left from the study's own stored trials (a resumed study), else when it will be estimated."""
        trials = search.study.get_trials(deepcopy=False)
        walls = [t.user_attrs["wall_time_s"] for t in trials
                 if counts(t) and isinstance(t.user_attrs.get("wall_time_s"), (int, float))]
        left = max(0, search.config.trials - sum(counts(t) for t in trials))
        if not walls:
            return f"time: estimated after each worker's first training and {ESTIMATE_AFTER} more on this machine"
        self.estimated = True
        return estimate_text(median(walls), left, self.workers, f"median of the study's {len(walls)} stored trials")

    def __call__(self, e: TrialEvent) -> None:
        now = self.clock()
        if self.first_counted is None:
            self.first_counted = e.counted - (e.state not in ("duplicate", "error", "interrupted", "surplus"))
        if e.state in TRAINED_STATES and not self.estimated:
            self.walls.append(e.wall_time_s)
            self.arrivals.append(now)
        value = f"loss {e.value:.4f}" if e.value is not None else e.state
        line = f"[{e.counted:>{len(str(e.target))}}/{e.target}] #{e.number} {e.role:<9} {e.arch.label()} "
        line += f"seed {e.seed} on {e.device}: "
        line += f"{value} ({e.state}, {e.wall_time_s:.1f}s)"
        if e.reason and e.state not in ("complete", "duplicate"):
            line += f" [{e.reason}]"
        if e.best is not None:
            line += f" | best {e.best[1]:.4f} #{e.best[0]}"
            if e.baseline:
                line += f" ({100 * (e.baseline - e.best[1]) / e.baseline:+.2f}% vs baseline {e.baseline:.4f})"
        done_here = e.counted - (self.first_counted or 0)
        if done_here > 0 and e.counted < e.target:
            rate = (now - self.started) / done_here
            line += f" | ETA {format_duration(rate * (e.target - e.counted))}"
        self.print(line)
        left = e.target - e.counted
        if self.estimated or not self.walls:
            return
        # the first ``workers`` trainings to end stand for each worker's first (a fast pruned trial may end before a
        # slow worker's first: the estimate then counts a little of a one-off start)
        measured = self.walls[self.workers:]
        if left <= 0:
            self.estimated = True
        elif len(measured) >= ESTIMATE_AFTER:
            # the median training, not the mean: one slow early training (a shape's first kernels, a disk cache being
            # filled) moved the mean of four by +16 % in a 200-trial run; the time between trainings (storage,
            # sampler: 1-2 % in benchmarks.main_job) is left out
            self.estimated = True
            pace = self.devices > 1  # workers of unlike speeds: no one training stands for them, their pace does
            if pace:
                ended = self.arrivals[self.workers - 1:self.workers + ESTIMATE_AFTER]
                per_trial = (ended[-1] - ended[0]) / ESTIMATE_AFTER
            else:
                per_trial = median(measured[:ESTIMATE_AFTER]) / self.workers
            self.print("estimate: " + rate_text(per_trial, left, self.workers, ESTIMATE_AFTER, pace))

    def print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)
