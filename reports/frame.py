"""A study read through Optuna's storage into pandas: one row per trial, one per shape, and what the study was.

``read_study`` is the one read a report makes: the trials (``study.get_trials``), the study's
own description (``nas:identity``, ``nas:preset``, ``nas:data``, ``nas:baseline_key``, stored
when ``nas search`` created it) and, when ``nas rerun`` wrote them, the full-scale re-runs.
Everything after it works on these frames, so a report is one consistent snapshot of a
study that a search may be writing at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig, format_plateaus
from nas.stats.answer import Answer, Budget, RuleInputs, build_answer
from nas.stats.board import ShrunkGain
from nas.stats.evidence import Evidence, TrialRole
from nas.stats.scores import ShapeScores
from nas.stats.shrinkage import Fit
from nas.study.records import RESULT_FAILURES, counts, is_duplicate, scores_by_shape, unreadable_attr
from reports.leaderboard import leaderboard_of
from search_spaces.base import Rule
from search_spaces.catalog import choose_rules, rule_catalog

TRIAL_COLUMNS = ("number", "state", "counted", "key", "seed", "role", "heads", "plateaus", "k", "d_h", "d_model",
                 "layers", "d_model_per_layer", "d_h_over_d_model", "params", "val_loss", "status", "reason",
                 "duplicate_of", "tokens_per_s", "wall_time_s", "eval_curve", "train_curve", "attention_distance",
                 "intermediate_values", "values", "datetime_start", "datetime_complete")


@dataclass
class StudyData:
    """One snapshot of a study: its trials as rows, its shapes' scores, and its own description."""

    name: str
    directions: list[optuna.study.StudyDirection]
    trials: list[FrozenTrial]
    frame: pd.DataFrame  # one row per trial (TRIAL_COLUMNS)
    evidence: Evidence  # the scores, the baseline and the trials' roles, with the shape model's fits made once
    board: pd.DataFrame  # the leaderboard: one row per shape, ranked by the shrunk gain (nas.stats.shrinkage)
    attrs: dict[str, Any] = field(default_factory=dict)  # the study's user attrs
    reruns: pd.DataFrame | None = None  # full-scale re-runs (nas rerun), one row per run; None when there are none
    skipped: list[str] = field(default_factory=list)  # one warning per trial whose stored attrs are unreadable
    answers: dict[tuple[str, ...], Answer] = field(default_factory=dict, repr=False)  # ``answer``'s cache
    storage: str | None = None  # the storage URL it was read from as the page may show it (its password masked)
    storage_note: str = ""  # what a command shown with ``storage`` adds (``nas.study.config.hidden_password_note``)

    @property
    def scores(self) -> dict[str, ShapeScores]:
        """Completed trainings per shape (``nas.study.records.scores_by_shape``)."""
        return self.evidence.scores

    @property
    def baseline_key(self) -> str | None:
        return self.evidence.baseline_key

    def model(self, min_tau_ratio: float = 0.0, plug_in: bool = False) -> Fit | None:
        """The shape model of this snapshot's scores (``nas.stats.evidence.Evidence.model``), fitted once a variant."""
        return self.evidence.model(min_tau_ratio, plug_in)

    def gains(self) -> dict[str, ShrunkGain]:
        """Every shape's shrunk gain over the baseline with its robust interval, computed once."""
        return self.evidence.gains()

    # ----------------------------------------------------------------- shapes and the rules they are read by
    def archs(self) -> dict[str, ArchConfig]:
        """Every trained shape by key (the first trial that stored it)."""
        out: dict[str, ArchConfig] = {}
        for t in self.trials:
            key, arch = t.user_attrs.get("key"), t.user_attrs.get("arch")
            if isinstance(key, str) and isinstance(arch, dict) and key not in out:
                out[key] = ArchConfig.from_dict(arch)
        return out

    @property
    def grouped(self) -> bool:
        """Whether the study trained a shape with grouped key/value heads."""
        return any(arch.grouped for arch in self.archs().values())

    def rule_catalog(self) -> tuple[Rule, ...]:
        """Every rule this study may be read by (``search_spaces.catalog``)."""
        return rule_catalog(self.space_name, self.grouped)

    def rules(self, names: str | None = None) -> tuple[Rule, ...]:
        """The default rules of the study's catalog, or those ``names`` lists (``UsageError`` for an unknown one)."""
        return choose_rules(self.rule_catalog(), names)

    def rule_inputs(self, rules: tuple[Rule, ...]) -> RuleInputs | None:
        """Each shape's covariates for ``rules`` and the longer budgets' re-runs; None without rules or baseline."""
        archs = self.archs()
        baseline = archs.get(self.baseline_key or "")
        if not rules or baseline is None:
            return None
        covariates = {key: tuple(rule.value(arch, baseline) for rule in rules) for key, arch in archs.items()}
        # a longer budget only: re-runs at the proxy's own tokens (a plain `nas rerun --preset tiny` of a tiny
        # study) check nothing about a rule at a longer budget, and read as if they did
        proxy_tokens = int((self.identity.get("train") or {}).get("tokens", 0) or 0)
        budgets = () if self.reruns is None or self.reruns.empty else tuple(
            Budget(str(label), rerun_scores(runs)) for label, runs in self.reruns.groupby("preset", sort=True)
            if runs["tokens"].dropna().max() > proxy_tokens)
        squares = {rule.name: rule.square_of for rule in rules if rule.square_of}
        left_out = {"pruned": tuple(t.user_attrs["key"] for t in self.trials if counts(t)
                                    and t.state == TrialState.PRUNED and t.user_attrs.get("key") in covariates),
                    "failed": tuple(t.user_attrs["key"] for t in self.trials if counts(t)
                                    and t.state == TrialState.FAIL and t.user_attrs.get("key") in covariates)}
        return RuleInputs(tuple(rule.name for rule in rules), covariates, budgets, squares, left_out)

    def answer(self, rules: tuple[Rule, ...] | None = None) -> Answer:
        """The study's answer (``nas.stats.answer``) with ``rules`` (default: the catalog's defaults), built once."""
        rules = self.rules() if rules is None else rules
        names = tuple(rule.name for rule in rules)
        if names not in self.answers:
            kv = {key: arch.kv_cache_bytes_per_token() for key, arch in self.archs().items()} if self.grouped \
                else None
            self.answers[names] = build_answer(self.evidence, self.rule_inputs(rules), kv)
        return self.answers[names]

    def shown(self, top: int) -> pd.DataFrame:
        """The board's rows a ``--top`` reader shows: the ``top`` best, the baseline and the answer's pick (after a race
        the board may rank it below ``top``, and the answer's sentence speaks of it)."""
        if self.board.empty:
            return self.board
        pick = self.answer().best
        return self.board[(self.board.index < top) | self.board["is_baseline"] | (self.board["key"] == pick)]

    @property
    def identity(self) -> dict[str, Any]:
        return self.attrs.get("nas:identity") or {}

    @property
    def space(self) -> dict[str, Any]:
        return self.identity.get("space") or {}

    @property
    def space_name(self) -> str:
        return str(self.space.get("space", "unknown"))

    @property
    def preset(self) -> str:
        return str(self.attrs.get("nas:preset", "unknown"))

    @property
    def data(self) -> str:
        return str(self.attrs.get("nas:data", "unknown"))

    @property
    def objectives(self) -> list[str]:
        return list(self.identity.get("objectives") or ["loss"])

    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    @property
    def trained(self) -> pd.DataFrame:
        """Rows of trials that trained a shape to a conclusion (complete, pruned, failed with a result)."""
        return self.frame[self.frame["counted"]] if not self.frame.empty else self.frame


# written on a RUNNING trial by a worker that fails it (nas.study.recovery) just before the state changes: a trial
# whose own worker finished it in that instant keeps the mark, and its state is the truth
_RECOVERY_MARKS = ("abandoned", "interrupted")


def _row(trial: FrozenTrial) -> dict[str, Any]:
    a = trial.user_attrs
    heads = a.get("heads")
    status, reason = a.get("status") or _status_of(trial), a.get("reason")
    if status in _RECOVERY_MARKS and trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        status, reason = _status_of(trial), None
    return {
        "number": trial.number, "state": trial.state.name, "counted": counts(trial), "key": a.get("key"),
        "seed": a.get("seed"), "role": a.get("role"), "heads": heads,
        "plateaus": format_plateaus(heads) if heads else None, "k": a.get("k"), "d_h": a.get("d_h"),
        "d_model": a.get("d_model"), "layers": a.get("layers"), "d_model_per_layer": a.get("d_model_per_layer"),
        "d_h_over_d_model": a.get("d_h_over_d_model"), "params": a.get("params"), "val_loss": a.get("val_loss"),
        "status": status, "reason": reason,
        "duplicate_of": a.get("duplicate_of"), "tokens_per_s": a.get("tokens_per_s"),
        "wall_time_s": a.get("wall_time_s"), "eval_curve": a.get("eval_curve") or [],
        "train_curve": a.get("train_curve") or [], "attention_distance": a.get("attention_distance") or [],
        "intermediate_values": dict(trial.intermediate_values), "values": trial.values,
        "datetime_start": trial.datetime_start, "datetime_complete": trial.datetime_complete,
    }


def _status_of(trial: FrozenTrial) -> str:
    return {TrialState.COMPLETE: "ok", TrialState.PRUNED: "pruned", TrialState.RUNNING: "running",
            TrialState.WAITING: "waiting"}.get(trial.state, "failed")


def read_study(study: optuna.Study, reruns: pd.DataFrame | None = None) -> StudyData:
    """The snapshot of ``study`` (see the module docstring); ``reruns`` as ``reports.reruns.read_reruns`` gives."""
    return study_data(study.study_name, list(study.directions), study.get_trials(deepcopy=False),
                      dict(study.user_attrs), reruns)


def study_data(name: str, directions: list[optuna.study.StudyDirection], trials: list[FrozenTrial],
               attrs: dict[str, Any], reruns: pd.DataFrame | None = None) -> StudyData:
    """A snapshot from trials and the study's user attrs (what ``read_study`` reads; simulations build them)."""
    trials, skipped = readable_trials(trials)
    frame = pd.DataFrame([_row(t) for t in trials], columns=list(TRIAL_COLUMNS))
    evidence = evidence_of(trials, attrs)
    board = leaderboard_of(trials, evidence.baseline_key, ranking=evidence.ranking(), scores=evidence.scores) \
        if evidence.scores else pd.DataFrame()
    return StudyData(name=name, directions=directions, trials=trials, frame=frame, evidence=evidence, board=board,
                     attrs=attrs, reruns=reruns, skipped=skipped)


def evidence_of(trials: list[FrozenTrial], attrs: dict[str, Any]) -> Evidence:
    """What the answer reads of these trials (``nas.stats.evidence``): scores, the baseline, the base seed and each
    trial's role."""
    roles = tuple(TrialRole(t.user_attrs["key"], int(t.user_attrs.get("seed", 0) or 0), t.user_attrs.get("role"),
                            counts(t)) for t in trials if isinstance(t.user_attrs.get("key"), str))
    base_seed = int(((attrs.get("nas:identity") or {}).get("train") or {}).get("seed", 0) or 0)
    return Evidence(scores_by_shape(trials), attrs.get("nas:baseline_key"), base_seed, roles)


def rerun_scores(runs: pd.DataFrame) -> dict[str, ShapeScores]:
    """One preset's re-runs as scores by the proxy shape's key (seeds and losses), as the statistics read a study's."""
    out = {}
    for key, group in runs.groupby("proxy_key"):
        group = group.sort_values("seed")
        out[str(key)] = ShapeScores(str(key), tuple(range(len(group))), tuple(int(s) for s in group["seed"]),
                                    tuple(float(v) for v in group["val_loss"]))
    return out


def readable_trials(trials: list[FrozenTrial]) -> tuple[list[FrozenTrial], list[str]]:
    """The trials with each unreadable one (``nas.study.records.unreadable_attr``) replaced by a failed stand-in
    that keeps its number (status ``unreadable``, counted nowhere), and one warning per stand-in."""
    kept, skipped = [], []
    for trial in trials:
        problem = unreadable_attr(trial, len(trials))
        if problem is None:
            kept.append(trial)
            continue
        name, why = problem
        skipped.append(f"trial #{trial.number} skipped: its stored attribute {name!r} {why}")
        stand_in = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
            "status": "unreadable", "reason": f"stored attribute {name!r} {why}"})
        stand_in.number = trial.number
        stand_in.datetime_start, stand_in.datetime_complete = trial.datetime_start, trial.datetime_complete
        kept.append(stand_in)
    return kept, skipped


def outcome_counts(data: StudyData) -> dict[str, int]:
    """How the study's trials ended: complete, pruned, failed results by reason, duplicates, and the rest.

    ``failed (...)`` keys count trained shapes that failed with a result (diverged, out of memory);
    ``interrupted``, ``killed or crashed`` and ``running`` count trials that did not train a shape to a
    conclusion (they are re-queued, and do not count towards ``--trials``).
    """
    tally: dict[str, int] = {"complete": 0, "pruned": 0}
    for t in data.trials:
        status = t.user_attrs.get("status")
        if is_duplicate(t):
            name = "duplicates"
        elif t.user_attrs.get("surplus"):
            name = "surplus"
        elif status == "unreadable":
            name = "unreadable (skipped)"
        elif t.state == TrialState.COMPLETE:
            name = "complete"
        elif t.state == TrialState.PRUNED:
            name = "pruned"
        elif t.state == TrialState.FAIL and status in RESULT_FAILURES:
            name = f"failed ({status})"
        elif t.state == TrialState.FAIL:
            name = "interrupted" if status == "interrupted" else "killed or crashed"
        else:
            name = t.state.name.lower()
        tally[name] = tally.get(name, 0) + 1
    return tally


def common_seeds(data: StudyData, key: str) -> tuple[int, ...]:
    """The seeds on which both ``key`` and the baseline completed a training (all of ``key``'s for the baseline).

    What compares two shapes' curves or attention distances: on a common seed both saw the same
    batches, so a seed's luck (0.1 nats on the default proxy) does not pass for a gain.
    """
    shape = data.scores.get(key)
    if shape is None:
        return ()
    base = data.scores.get(data.baseline_key) if data.baseline_key is not None else None
    mine = sorted(set(shape.seeds))
    return tuple(mine if base is None or key == data.baseline_key else sorted(set(mine) & set(base.seeds)))


def trials_on(data: StudyData, key: str, seeds: tuple[int, ...] | None = None) -> list[FrozenTrial]:
    """``key``'s completed trainings (all of them, or those on ``seeds``) in trial order."""
    scores = data.scores.get(key)
    if scores is None:
        return []
    chosen = {n for n, seed in zip(scores.trials, scores.seeds) if seeds is None or seed in seeds}
    return [t for t in data.trials if t.number in chosen and t.state == TrialState.COMPLETE]


def seeds_text(seeds: tuple[int, ...]) -> str:
    """``seed 0``, ``seeds 0-8`` or ``seeds 0, 3, 5``: which seeds a curve or a mean is over."""
    if not seeds:
        return "no seed"
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))
