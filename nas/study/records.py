"""How a trial reads back from Optuna storage: its user attrs, the counting rules, and each shape's scores.

Everything a person needs later lives in the trial's ``user_attrs`` (readable in
optuna-dashboard): the shape (``arch``, ``heads``, ``k``, ``d_h``, ratios), the seed, the
role (baseline, member, replicate, sampled), and after training the ``TrialResult``
(``val_loss``, curves, tokens/s, attention distances, ``status`` and ``reason``).

A trial *counts* towards ``--trials`` when it trained a shape to a conclusion: complete,
pruned, or failed with a result (diverged, out of memory). Duplicates (answered from an
earlier trial) and trials that were interrupted, killed or crashed do not count; the last
two are re-queued.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig
from nas.stats.scores import ShapeScores

RESULT_FAILURES = ("diverged", "oom")  # failed *results*: the shape was trained and is bad
RERUN_MARK = "nas:rerun_of"  # the study attr of a study holding full-scale re-runs: its proxy study's name


def rerun_study_name(proxy_study: str, preset: str) -> str:
    """The study that holds ``proxy_study``'s re-runs at ``preset`` (``nas rerun``; others' settings add a digest)."""
    return f"{proxy_study}:rerun:{preset}"


def shape_attrs(arch: ArchConfig, seed: int, role: str) -> dict[str, Any]:
    """Attrs set before training: what is trained, with which seed, and why (the report's axes included)."""
    return {"key": arch.key(), "seed": seed, "role": role, "arch": arch.to_dict(), **arch.summary()}


def is_duplicate(trial: FrozenTrial) -> bool:
    return "duplicate_of" in trial.user_attrs


def counts(trial: FrozenTrial) -> bool:
    """Did this trial train a shape to a conclusion (see module docstring)?"""
    if is_duplicate(trial) or trial.user_attrs.get("surplus"):
        return False
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get("status") in RESULT_FAILURES


def in_flight(trial: FrozenTrial) -> bool:
    """Running, not a duplicate, not surplus: it will probably count when it ends.

    A trial just handed out by ``ask`` has no shape (``key``) yet, and is in flight all the same:
    otherwise two workers racing for the last slot would both train.
    """
    return trial.state == TrialState.RUNNING and not is_duplicate(trial) and not trial.user_attrs.get("surplus")


def key_seed(trial: FrozenTrial) -> tuple[str, int] | None:
    """The (shape key, seed) the trial trains; None without a shape, or where the stored ones are not a key and a
    seed (a storage edited by hand: ``int('one')`` stopped a resumed search with a traceback, where every reader
    skips the trial with a warning)."""
    key, seed = trial.user_attrs.get("key"), trial.user_attrs.get("seed", 0)
    if not isinstance(key, str) or isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        return None
    return key, seed


def arch_of(trial: FrozenTrial) -> ArchConfig | None:
    data = trial.user_attrs.get("arch")
    return ArchConfig.from_dict(data) if data else None


def loss_of(trial: FrozenTrial) -> float:
    """The trial's validation loss; inf for failed results and trials without one."""
    value = trial.user_attrs.get("val_loss")
    if trial.state == TrialState.COMPLETE and trial.values:
        value = trial.values[0]
    return float(value) if value is not None and trial.state != TrialState.FAIL else math.inf


def scores_by_shape(trials: Iterable[FrozenTrial]) -> dict[str, ShapeScores]:
    """Every shape's ``ShapeScores``, in the order of each shape's first completed trial.

    The one place a shape's mean over seeds is computed: the progress line, the replicate planner
    and the leaderboard all rank shapes by it, put on the baseline's seeds (``seed_adjusted_means``).
    """
    grouped: dict[str, list[tuple[FrozenTrial, int]]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if t.state == TrialState.COMPLETE and counts(t) and (pair := key_seed(t)) is not None:
            grouped.setdefault(pair[0], []).append((t, pair[1]))
    return {key: ShapeScores(key, tuple(t.number for t, _ in group), tuple(seed for _, seed in group),
                             tuple(loss_of(t) for t, _ in group))
            for key, group in grouped.items()}


# ----------------------------------------------------------------- reading stored attrs back
NUMBER_ATTRS = ("val_loss", "params", "tokens_per_s", "wall_time_s", "d_model", "layers", "k", "d_h",
                "d_model_per_layer", "d_h_over_d_model")
TEXT_ATTRS = ("key", "role", "status", "reason")
CURVE_ATTRS = ("eval_curve", "train_curve")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_curve(value: Any) -> bool:
    """``[[tokens, loss or null], ...]``, as ``nas.study.trial.result_attrs`` writes it."""
    return isinstance(value, list) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and _is_number(p[0]) and (p[1] is None or _is_number(p[1]))
        for p in value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def unreadable_attr(trial: FrozenTrial, n_trials: int) -> tuple[str, str] | None:
    """``(attribute, why)`` for the first stored attribute of ``trial`` that a report cannot read, else None.

    A trial of a study that ``nas search`` wrote reads back as that format (the module docstring);
    one whose attrs were edited by hand, or written by another version of the tool, may not: a
    ``val_loss`` that is a string, a trained trial without its ``heads``. ``n_trials`` is the
    study's trial count (a ``duplicate_of`` must name one of its trials).
    """
    a = trial.user_attrs
    for name in TEXT_ATTRS:
        if name in a and a[name] is not None and not isinstance(a[name], str):
            return name, f"is {_shown(a[name])}, not a string"
    for name in NUMBER_ATTRS:
        if a.get(name) is not None and not _is_number(a[name]):
            return name, f"is {_shown(a[name])}, not a number"
    if "seed" in a and (not isinstance(a["seed"], int) or isinstance(a["seed"], bool) or a["seed"] < 0):
        return "seed", f"is {_shown(a['seed'])}, not a whole number >= 0"
    for name in CURVE_ATTRS:
        if a.get(name) is not None and not _is_curve(a[name]):
            return name, f"is {_shown(a[name])}, not a list of [tokens, loss] pairs"
    distances = a.get("attention_distance")
    if distances is not None and not (isinstance(distances, list) and all(map(_is_number, distances))):
        return "attention_distance", f"is {_shown(distances)}, not a list of numbers"
    if "duplicate_of" in a:
        original = a["duplicate_of"]
        if not isinstance(original, int) or isinstance(original, bool) or not 0 <= original < n_trials \
                or original == trial.number:
            return "duplicate_of", f"is {_shown(original)}, not the number of another trial of the study"
    for name in ("key", "heads", "arch") if counts(trial) else ():
        if name not in a:
            return name, "is missing (a trained trial records its shape)"
    if a.get("heads") is not None and not (isinstance(a["heads"], list) and a["heads"] and all(
            isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in a["heads"])):
        return "heads", f"is {_shown(a['heads'])}, not a list of head counts"
    if a.get("arch") is not None:
        try:
            ArchConfig.from_dict(a["arch"])
        except Exception as error:  # noqa: BLE001 - any way a stored shape fails to build is unreadable
            return "arch", f"is not a shape ({str(error).splitlines()[0][:80] if str(error) else type(error).__name__})"
    return None
