"""A run's training throughput, past the steps that carry a process's one-off costs.

The first steps a process trains pay what later ones do not: the fused CPU kernels loaded (or built), the
optimizer's first ``step`` importing ``torch._dynamo`` (~0.8 s, before ``runners.optimizer``), first-touch
allocation, CUDA's lazy
initialisation. Timed with them, the first trial of every search, the baseline, read 1,053 tokens/s against
10,827-23,779 for shapes of its size at the ``tiny`` proxy (4,096 tokens, 32 steps), so every "tokens/s vs the
baseline" ratio and the ``tokens_per_s`` objective were off. ``TrainClock`` times every step (the ETA and the
time budget need the whole) and, apart, the steps from ``timed_from``: tokens/s is read from those.
"""

from __future__ import annotations

from dataclasses import dataclass


def warmup_steps(steps: int) -> int:
    """Steps of a run left out of its tokens/s: 2 of a run of 8 or more, 1 of 2-7, none of a one-step run."""
    return 2 if steps >= 8 else 1 if steps >= 2 else 0


@dataclass
class TrainClock:
    """Seconds of training steps: all of them, and those from step ``timed_from`` on (the steady ones)."""

    first: int  # the first step this process trains (a resumed run starts past 0)
    timed_from: int  # the first step its tokens/s counts
    total_s: float = 0.0
    steady_s: float = 0.0

    @classmethod
    def for_run(cls, steps: int, first: int = 0) -> TrainClock:
        return cls(first=first, timed_from=first + warmup_steps(steps - first))

    def steady_from(self, step: int) -> bool:
        """Whether ``step`` is the first steady step after a warm-up: where a device's queue is drained (CUDA) so that
        the warm-up steps' kernels are not timed as the steady ones'."""
        return step == self.timed_from and step > self.first

    def add(self, step: int, seconds: float) -> None:
        self.total_s += seconds
        if step >= self.timed_from:
            self.steady_s += seconds

    def tokens_per_s(self, steps_done: int, tokens_per_step: int) -> float:
        """Tokens a second over the steady steps of the first ``steps_done``; over all of them when the run stopped
        within its warm-up (a divergence at step 1)."""
        steady = steps_done - self.timed_from
        if steady > 0 and self.steady_s > 0:
            return steady * tokens_per_step / self.steady_s
        done = steps_done - self.first
        return done * tokens_per_step / self.total_s if done > 0 and self.total_s > 0 else 0.0
