"""Studies made with Optuna's API, without training, that look like the ones ``nas search`` writes.

Used by the report's tests and its speed benchmark: every trial carries the user attrs a real
trial carries (``nas.study.records.shape_attrs`` plus a result: ``val_loss``, curves, attention
distances, tokens/s, ``status``), params with the distributions the space's ``suggest`` would
record, and the study the user attrs ``nas search`` sets. Losses come from a known "true" loss
per shape plus seed noise, so a test can check what a report says against the truth:

- prism: a few tenths of a percent of gain for schedules whose first plateau is wide-headed
  (head dim >= 16), a penalty for 1-2 heads early;
- hourglass and joint: a U-shape in ``log(d_model / L)`` with its minimum at ``OPTIMUM_RATIO``
  plus a small gain per extra sub-MLP.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig
from nas.study.records import shape_attrs
from runners.presets import get_preset
from search_spaces.base import SearchSpace
from search_spaces.factory import SpaceOptions, build_space

BASE_LOSS = 2.90
SEED_SD = 0.03  # seed-to-seed sd of one shape's loss
OPTIMUM_RATIO = 5.0  # d_model / L at the synthetic width-depth optimum


class _RecordingTrial:
    """Answers ``suggest_*`` from fixed params and records the distribution each call declares."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params, self.distributions = params, {}

    def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
        self.distributions[name] = IntDistribution(low, high)
        return int(self.params[name])

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        self.distributions[name] = CategoricalDistribution(tuple(choices))
        return self.params[name]


def params_and_distributions(space: SearchSpace,
                             arch: ArchConfig) -> tuple[dict[str, Any], dict[str, BaseDistribution]]:
    recorder = _RecordingTrial(space.params_of(arch))
    assert space.suggest(recorder) == arch  # type: ignore[arg-type]
    return {k: recorder.params[k] for k in recorder.distributions}, recorder.distributions


def true_loss(arch: ArchConfig, baseline: ArchConfig) -> float:
    """The synthetic "true" mean loss of a shape (see the module docstring)."""
    loss = BASE_LOSS
    if len(set(arch.heads)) > 1:
        first_dim = arch.d_model // arch.heads[0]
        loss += -0.004 if first_dim >= 16 else 0.02 if arch.heads[0] <= 2 else 0.0
    if arch.ffn.k > 1 or arch.d_model != baseline.d_model or arch.n_layers != baseline.n_layers:
        x = math.log(arch.d_model / arch.n_layers / OPTIMUM_RATIO)
        loss += 0.08 * x * x - 0.002 * (arch.ffn.k - 1)
    return loss


@dataclass
class SyntheticSpec:
    space: str = "prism"
    preset: str = "cpu"
    trials: int = 60
    replicate_top: int = 4
    objectives: tuple[str, ...] = ("loss",)
    prune_share: float = 0.2  # members stopped at their first evaluation
    diverge_share: float = 0.03
    failures_only: bool = False
    seed: int = 0


def _result_attrs(arch: ArchConfig, loss: float, rng: random.Random, tokens: int, status: str,
                  stop_at: int | None = None) -> tuple[dict[str, Any], dict[int, float]]:
    points = [tokens // 4 * (i + 1) for i in range(4)][: stop_at or 4]
    curve = [(t, loss + 2.4 * math.exp(-3.0 * t / tokens) + rng.gauss(0, 0.005)) for t in points]
    if status == "ok":
        curve[-1] = (curve[-1][0], loss)
    train = [(t, v + rng.gauss(0, 0.05)) for t, v in curve]
    distances = [1.0 + 6.0 * (layer / max(1, arch.n_layers - 1)) * (1 + 0.1 * rng.random())
                 for layer in range(arch.n_layers)]
    speed = 4000.0 * (96 / arch.d_model) ** 2 * (12 / arch.n_layers) * (1 + 0.03 * rng.random())
    speed /= 1 + 0.1 * arch.ffn.k
    attrs = {"status": status, "reason": None if status == "ok" else f"{status} (synthetic)",
             "val_loss": curve[-1][1] if status != "diverged" else None, "eval_curve": [list(p) for p in curve],
             "train_curve": [list(p) for p in train], "attention_distance": distances if status == "ok" else [],
             "tokens_per_s": speed, "wall_time_s": tokens / speed, "params_breakdown": arch.n_params(),
             "flops_per_token": arch.flops_per_token(128), "tokens_seen": points[-1]}
    return attrs, dict(curve)


def synthetic_trials(spec: SyntheticSpec) -> tuple[SearchSpace, list[FrozenTrial], dict[str, Any]]:
    """The space, the trials in order, and the study user attrs of a synthetic study."""
    preset = get_preset(spec.preset)
    space = build_space(SpaceOptions(space=spec.space), defaults=preset.baseline)
    baseline = space.baseline()
    rng = random.Random(spec.seed)
    tokens = preset.train.tokens
    members = list(space)
    order = [baseline] + [a for a in rng.sample(members, len(members)) if a != baseline]
    trials: list[FrozenTrial] = []
    seen: dict[tuple[str, int], int] = {}

    def add(arch: ArchConfig, seed: int, role: str, state_hint: str = "ok") -> None:
        params, distributions = params_and_distributions(space, arch)
        truth = true_loss(arch, baseline)
        loss = truth + rng.gauss(0, SEED_SD)
        attrs = {**shape_attrs(arch, seed, role)}
        state, values, intermediate = TrialState.COMPLETE, None, {}
        if (arch.key(), seed) in seen:  # answered from the stored result, as a real search does
            original = trials[seen[(arch.key(), seed)]]
            attrs.update(duplicate_of=original.number, val_loss=original.user_attrs.get("val_loss"),
                         status=original.user_attrs.get("status"))
            state, values = original.state, original.values
        else:
            status = state_hint
            result, intermediate = _result_attrs(arch, loss, rng, tokens, status, 1 if status == "pruned" else None)
            attrs.update(result)
            if status == "ok":
                values = [loss] + [float(arch.n_params()["total"]) if o == "params" else result["tokens_per_s"]
                                   for o in spec.objectives[1:]]
            else:
                state = TrialState.PRUNED if status == "pruned" else TrialState.FAIL
            seen[(arch.key(), seed)] = len(trials)
        single = len(spec.objectives) == 1
        trial = optuna.trial.create_trial(state=state, values=values, params=params, distributions=distributions,
                                          user_attrs=attrs, intermediate_values=intermediate if single else None)
        trial.number = len(trials)
        trials.append(trial)

    counted = lambda: sum(1 for t in trials if "duplicate_of" not in t.user_attrs)  # noqa: E731
    for i, arch in enumerate(order):
        if counted() >= spec.trials:
            break
        hint = "ok"
        if spec.failures_only:
            hint = "diverged"
        elif i > 5 and len(spec.objectives) == 1 and rng.random() < spec.prune_share:
            hint = "pruned"
        elif i > 0 and rng.random() < spec.diverge_share:
            hint = "diverged"
        add(arch, 0, "baseline" if i == 0 else "member", hint)
        if i % 17 == 5:
            add(arch, 0, "member")  # a duplicate proposal
    seed = 1
    while counted() < spec.trials and not spec.failures_only:
        done = [t for t in trials if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs]
        by_key: dict[str, list[float]] = {}
        for t in done:
            by_key.setdefault(t.user_attrs["key"], []).append(t.values[0])
        ranked = sorted(by_key, key=lambda k: sum(by_key[k]) / len(by_key[k]))
        picks = [baseline.key()] + [k for k in ranked if k != baseline.key()][: spec.replicate_top]
        archs = {t.user_attrs["key"]: ArchConfig.from_dict(t.user_attrs["arch"]) for t in done}
        for key in picks:
            if counted() >= spec.trials:
                break
            add(archs.get(key, baseline), seed, "replicate")
        seed += 1
    identity = {"space": space.describe(), "train": preset.train.to_dict(), "data": "0" * 16,
                "objectives": list(spec.objectives)}
    study_attrs = {"nas:identity": identity, "nas:baseline_key": baseline.key(), "nas:preset": spec.preset,
                   "nas:data": "builtin"}
    return space, trials, study_attrs


def synthetic_study(spec: SyntheticSpec, storage: optuna.storages.BaseStorage | str | None = None,
                    name: str = "synthetic",
                    before_add: Callable[[optuna.Study], None] | None = None) -> optuna.Study:
    """A study (in ``storage``, in memory by default) holding ``synthetic_trials(spec)``."""
    _, trials, attrs = synthetic_trials(spec)
    directions = ["minimize"] + ["maximize" if o == "tokens_per_s" else "minimize" for o in spec.objectives[1:]]
    study = optuna.create_study(storage=storage, study_name=name, directions=directions)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    if before_add is not None:
        before_add(study)
    study.add_trials(trials)
    return study
