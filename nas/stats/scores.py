"""A study's scores as the statistics read them: each shape's completed trainings (seeds and losses), and means
put on the baseline's seeds. Built from the stored trials by ``nas.study.records.scores_by_shape``."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class ShapeScores:
    """One shape's completed trainings (counted, not pruned, not duplicates): seeds and losses in trial order."""

    key: str
    trials: tuple[int, ...]  # trial numbers, ascending; the first is the shape's first trained trial
    seeds: tuple[int, ...]
    losses: tuple[float, ...]

    @property
    def first_trial(self) -> int:
        return self.trials[0]

    @property
    def n(self) -> int:
        return len(self.losses)

    @property
    def mean(self) -> float:
        """The shape's score: its mean validation loss over seeds (one lucky seed is not a gain)."""
        return fmean(self.losses)


def seed_adjusted_means(scores: dict[str, ShapeScores], baseline_key: str | None) -> dict[str, float]:
    """Every shape's mean loss put on the baseline's seeds, so that shapes trained on different seeds compare.

    ``L_adj(s) = mean_b + mean_{i in S_s & S_b} (L_s(i) - L_b(i))``: the baseline's mean over all its
    seeds plus the shape's mean paired difference on the seeds both share (a control variate; with
    common random numbers, one seed gives every shape the same batches, so a seed's luck is partly
    shared: ``benchmarks/proxy_noise.py`` measures a correlation of about 0.5). A shape trained on all
    the baseline's seeds keeps its own mean; one trained on seed 0 alone is no longer compared, through
    seed 0's luck, with shapes averaged over nine seeds. Shapes without a common seed, and every shape
    when there is no baseline, keep their plain mean.
    """
    base = scores.get(baseline_key) if baseline_key is not None else None
    if base is None:
        return {key: shape.mean for key, shape in scores.items()}
    base_at = mean_by_seed(base)
    return {key: shape.mean if key == baseline_key else adjusted_mean(shape, base_at, base.mean)
            for key, shape in scores.items()}


def mean_by_seed(shape: ShapeScores) -> dict[int, float]:
    """The shape's loss on each of its seeds (the mean, should a seed have been trained twice)."""
    by_seed: dict[int, list[float]] = {}
    for seed, loss in zip(shape.seeds, shape.losses):
        by_seed.setdefault(seed, []).append(loss)
    return {seed: fmean(losses) for seed, losses in by_seed.items()}


def adjusted_mean(shape: ShapeScores, base_at: dict[int, float], base_mean: float) -> float:
    """One shape's ``seed_adjusted_means`` entry, given the baseline's loss per seed and its mean."""
    diffs = [loss - base_at[seed] for seed, loss in zip(shape.seeds, shape.losses) if seed in base_at]
    return base_mean + fmean(diffs) if diffs else shape.mean
