"""What a study's answer is read from: every shape's scores, the baseline, and what each trial was for.

One ``Evidence`` holds a snapshot's scores (``nas.stats.scores``), the study's baseline and base seed, and each
trial's shape, seed and role (the first pass, a race, fixed or adaptive replicates), with the fits of the shape model
made once and shared by everything that reads them (the board, the answer, its resolution, the adaptive state). It
is built from stored trials by the readers (``reports.frame``) and from simulated ones by the benchmarks; the answer
(``nas.stats.answer``) is a function of it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nas.stats.adaptive import ADAPTIVE_ROLES, MIN_TAU_RATIO, AdaptiveState, adaptive_state
from nas.stats.board import Ranking, ShrunkGain, rank_shapes
from nas.stats.comparisons import ALPHA, PairedGain, paired_gain
from nas.stats.race import RACE_ROLES, RaceState, race_state
from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import Fit, fit

SELECTING_ROLES = ("member", "sampled")  # the first-pass trials by which a shape entered the top of the board
REPLICATE_ROLES = ("replicate", "race", "confirm", "adaptive", "adaptive-confirm")  # trials after the first pass


@dataclass(frozen=True)
class TrialRole:
    """What one trial of the study was: its shape, seed and role, and whether it trained a shape to a conclusion."""

    key: str
    seed: int
    role: str | None
    counted: bool


@dataclass
class Evidence:
    """A study's scores and trial roles, with the shape model's fits made once (module docstring)."""

    scores: dict[str, ShapeScores]
    baseline_key: str | None
    base_seed: int = 0
    roles: tuple[TrialRole, ...] = ()
    fits: dict[tuple[float, bool], Fit | None] = field(default_factory=dict, repr=False)
    _ranking: Ranking | None = field(default=None, repr=False)

    # ----------------------------------------------------------------- the shape model, fitted once per variant
    def model(self, min_tau_ratio: float = 0.0, plug_in: bool = False) -> Fit | None:
        """The shape model of the scores (``nas.stats.shrinkage.fit``): the board's (the baseline a fixed effect) by
        default; the allocation's keeps it a member (``nas.stats.adaptive``)."""
        variant = (min_tau_ratio, plug_in)
        if variant not in self.fits:
            fixed = self.baseline_key if min_tau_ratio == 0 else None
            self.fits[variant] = fit(self.scores, min_tau_ratio, plug_in, baseline=fixed) if self.scores else None
        return self.fits[variant]

    def ranking(self) -> Ranking:
        """The board: order, ranked losses and every shape's shrunk gain (``nas.stats.board.rank_shapes``)."""
        if self._ranking is None:
            model = self.model() if self.baseline_key in self.scores else None
            self._ranking = rank_shapes(self.scores, self.baseline_key, model)
        return self._ranking

    def gains(self) -> dict[str, ShrunkGain]:
        return self.ranking().gains

    @property
    def has_baseline(self) -> bool:
        return self.baseline_key is not None and self.baseline_key in self.scores

    @property
    def baseline_loss(self) -> float | None:
        return self.scores[self.baseline_key].mean if self.has_baseline else None  # type: ignore[index]

    # ----------------------------------------------------------------- what the trials were for
    def selecting_seeds(self, key: str) -> set[int]:
        """The seeds of ``key``'s first-pass trials: what selected it, and so not what may estimate its gain."""
        if key == self.baseline_key:
            return set()
        return {r.seed for r in self.roles if r.key == key and r.role in SELECTING_ROLES}

    def raced(self) -> tuple[str, ...]:
        """The race's candidates (baseline first) when the study raced, else ()."""
        keys = list(dict.fromkeys(r.key for r in self.roles if r.role in RACE_ROLES))
        if not keys or self.baseline_key is None:
            return ()
        return (self.baseline_key, *(k for k in keys if k != self.baseline_key))

    def race(self) -> RaceState | None:
        candidates = self.raced()
        return race_state(self.scores, candidates, self.base_seed) if candidates else None

    def replicated(self) -> tuple[str, ...]:
        """The shapes besides the baseline that received fixed replicates, in the order they began: the fixed
        policy's pick is chosen among them on their replicate seeds."""
        return tuple(dict.fromkeys(r.key for r in self.roles if r.role == "replicate" and r.key != self.baseline_key))

    @property
    def adaptive(self) -> bool:
        """Whether the study spent replicates adaptively (``nas.study.adaptive``) and has its baseline."""
        return self.has_baseline and any(r.role in ADAPTIVE_ROLES for r in self.roles)

    def adaptive_state(self) -> AdaptiveState | None:
        """The adaptive allocation's state (``nas.stats.adaptive``) when the study allocated adaptively."""
        if not self.adaptive:
            return None
        return adaptive_state(self.scores, self.baseline_key, self.base_seed, board=self.model(),  # type: ignore[arg-type]
                              floored=self.model(MIN_TAU_RATIO))

    def replicate_trials(self) -> int:
        """The trainings the study spent after its first pass (every replicates policy's roles)."""
        return sum(1 for r in self.roles if r.role in REPLICATE_ROLES and r.counted)

    # ----------------------------------------------------------------- gains over the baseline
    def interval_alpha(self, key: str) -> float:
        """The two-sided level of ``key``'s gain interval: simultaneous (Bonferroni) over the race's candidates when
        ``key`` raced, over the replicated shapes when it received fixed replicates, else ``ALPHA``."""
        candidates = self.raced()
        if key in candidates:
            return ALPHA / max(1, len(candidates) - 1)
        chosen_among = self.replicated()
        return ALPHA / len(chosen_among) if key in chosen_among else ALPHA

    def honest_gain(self, key: str) -> PairedGain | None:
        """``key``'s paired gain over the baseline on the common seeds that did not select it (simultaneous over the
        race's candidates or the replicated shapes: ``interval_alpha``)."""
        if not self.has_baseline or key not in self.scores:
            return None
        # no pooled sd: no interval on one paired seed (a pooled one ignores that the seed was chosen)
        return paired_gain(self.scores[key], self.scores[self.baseline_key], self.selecting_seeds(key),  # type: ignore[index]
                           alpha=self.interval_alpha(key))
