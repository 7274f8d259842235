"""The Optuna study behind ``nas search``: setup, the worker loop, and what each trial trains.

A worker repeats: fail stale trials (killed workers), stop when the study holds ``trials``
counted trials, otherwise choose the next piece of work and train it:

1. waiting trials first (the baseline, enqueued as trial 0; re-queued killed/interrupted trials):
   they are the only trials in Optuna's queue, so a re-queued shape is never left behind;
2. a space with no more members than ``trials`` is walked exhaustively, in its order;
   once every member is trained, seed replicates of the best shapes and the baseline
   (the planned shape is drawn through a ``PartialFixedSampler``, not enqueued);
3. otherwise the sampler (TPE by default) proposes a shape.

No shape is trained twice with the same seed: a trial whose (shape, seed) was already
trained is answered from the stored result and marked ``duplicate_of`` (it does not
count); one that is being trained by a lower-numbered trial waits for it. Workers on any
number of machines share one study through the storage (Optuna's own model).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
import warnings
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig
from nas.data import TokenData, load_data
from nas.errors import UsageError
from nas.heartbeat import Heartbeat
from nas.records import (arch_of, counts, in_flight, is_duplicate, key_seed, loss_of, result_attrs, set_attrs,
                         shape_attrs)
from nas.search_config import OBJECTIVES, PRUNERS, SAMPLERS, SearchConfig  # noqa: F401 - re-exported
from nas.storage import make_storage, unbeaten_trial_ids
from runners.config import TrainConfig
from runners.device import available_cores
from runners.presets import get_preset
from runners.proxy import run as run_proxy
from search_spaces.base import SearchSpace
from search_spaces.factory import SpaceOptions, build_space

POLL_S = 0.5  # how often a waiting worker looks at the storage again
MEDIAN_STARTUP_TRIALS = 5  # completed trainings with a value at a step before the median pruner prunes there
MAX_DUPLICATE_STREAK = 10  # after this many duplicates in a row, one random proposal breaks the loop
MAX_ERROR_STREAK = 3  # trials in a row crashing with an error (not a result) stop the worker
ABANDONED_AFTER_S = 120.0  # a RUNNING trial this old that never beat was abandoned (worker died right after ask)


class SearchAborted(RuntimeError):
    """The worker cannot go on (e.g. every trial crashes); the message says why."""


@dataclass
class Search:
    """One process's view of the study: the loaded data, the space, the training setup."""

    config: SearchConfig
    study: optuna.Study
    space: SearchSpace
    train: TrainConfig
    data: TokenData
    exhaustive: bool
    worker: int = 0
    notes: list[str] = field(default_factory=list)  # what the command should say besides the trials (a dead worker)

    @property
    def baseline(self) -> ArchConfig:
        return self.space.baseline()

    @property
    def multi_objective(self) -> bool:
        return len(self.config.objectives) > 1


@dataclass
class TrialEvent:
    """What the progress display hears after each trial."""

    number: int
    role: str
    arch: ArchConfig
    seed: int
    state: str  # complete | pruned | duplicate | diverged | oom | error | interrupted | surplus
    value: float | None
    wall_time_s: float
    counted: int
    target: int
    best: tuple[int, float] | None  # the best shape: (its first trial's number, mean loss over its seeds)
    baseline: float | None  # the baseline's mean loss over its seeds
    reason: str | None = None


# ----------------------------------------------------------------- setup
def train_config(config: SearchConfig) -> TrainConfig:
    train = get_preset(config.preset).train
    overrides = dict(config.train_overrides)
    if config.workers > 1 and not overrides.get("threads"):
        overrides["threads"] = max(1, available_cores() // config.workers)
    return train.with_(**overrides) if overrides else train


# how a trial runs, not what it computes: a study can be resumed (or shared) with other values
RUN_ONLY_FIELDS = ("threads", "device", "compile")


def identity(config: SearchConfig, space: SearchSpace, train: TrainConfig, data: TokenData) -> dict[str, Any]:
    """What defines a study: two commands with the same identity continue one study."""
    train_part = {k: v for k, v in train.to_dict().items() if k not in RUN_ONLY_FIELDS}
    ident = {"space": space.describe(), "train": train_part, "data": data.fingerprint,
             "objectives": list(config.objectives)}
    return json.loads(json.dumps(ident, sort_keys=True, default=str))


def default_study_name(config: SearchConfig, ident: dict[str, Any]) -> str:
    """``<space>-<preset>``, plus a short hash when shape, training or data differ from the preset's defaults.

    Run-only options (``--threads``, ``--device``, ``--compile``) and overrides equal to the preset's
    value keep the plain name, so the same study resumes whatever machine or thread count runs it.
    """
    default = SearchConfig(space=SpaceOptions(space=config.space.space), preset=config.preset,
                           objectives=config.objectives)
    name = f"{config.space.space}-{config.preset}"
    preset_train = get_preset(config.preset).train.to_dict()
    changed_training = any(k not in RUN_ONLY_FIELDS and preset_train[k] != v for k, v in config.train_overrides)
    if config.space != default.space or changed_training or config.data != "builtin" \
            or config.objectives != ("loss",):
        digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:6]
        name += f"-{digest}"
    return name


def make_sampler(config: SearchConfig, seed: int) -> optuna.samplers.BaseSampler:
    name = config.sampler or ("tpe" if len(config.objectives) == 1 else "nsga2")
    if name == "tpe":
        return optuna.samplers.TPESampler(multivariate=True, group=True, constant_liar=True, seed=seed,
                                          n_startup_trials=10)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.BruteForceSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.GPSampler(seed=seed)  # single objective only: SearchConfig.validate checks


def make_pruner(config: SearchConfig, train: TrainConfig) -> optuna.pruners.BasePruner:
    if config.pruner == "none" or len(config.objectives) > 1:  # Optuna prunes single-objective studies only
        return optuna.pruners.NopPruner()
    if config.pruner == "median":
        # Duplicates are told COMPLETE (with the original's value, without intermediate values), so
        # n_startup_trials alone would count them; n_min_trials counts only completed trials that
        # reported at the step in question, i.e. real trainings.
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=0,
                                           n_min_trials=MEDIAN_STARTUP_TRIALS)
    return optuna.pruners.HyperbandPruner(min_resource=train.eval_every, max_resource=train.tokens,
                                          reduction_factor=3)


def _quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # our ask/tell loop runs its own heartbeat thread (nas.heartbeat), which Optuna cannot see
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


def open_search(config: SearchConfig, worker: int = 0, create: bool = True) -> Search:
    """Load data, build the space, create or load the study (checking it was made with the same options)."""
    config.validate()
    _quiet_optuna()
    preset = get_preset(config.preset)
    train = train_config(config)
    data = load_data(config.data, cache_dir=config.cache_dir)
    space = build_space(config.space, defaults=preset.baseline.replace(vocab_size=data.vocab_size))
    ident = identity(config, space, train, data)
    name = config.study_name or default_study_name(config, ident)
    config = replace(config, study_name=name)
    storage = make_storage(config.storage, heartbeat_interval=config.heartbeat_interval)
    directions = [OBJECTIVES[o] for o in config.objectives]
    sampler = make_sampler(config, seed=train.seed + 1000 * worker)
    pruner = make_pruner(config, train)
    created = False
    if create:
        try:
            study = optuna.create_study(storage=storage, study_name=name, directions=directions,
                                        sampler=sampler, pruner=pruner)
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            pass
    if not created:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
    search = Search(config, study, space, train, data, exhaustive=space.count() <= config.trials, worker=worker)
    if created:
        baseline = search.baseline
        study.enqueue_trial(space.params_of(baseline), user_attrs={"key": baseline.key(), "seed": train.seed,
                                                                   "role": "baseline"})
        study.set_user_attr("nas:identity", ident)
        study.set_user_attr("nas:baseline_key", baseline.key())
        study.set_user_attr("nas:preset", config.preset)
    else:
        _check_identity(study, ident, config)
    return search


def _check_identity(study: optuna.Study, ident: dict[str, Any], config: SearchConfig) -> None:
    deadline = time.monotonic() + 60
    while "nas:identity" not in study.user_attrs:  # another worker is creating it right now
        if time.monotonic() > deadline:
            raise UsageError(f"study {config.study_name!r} exists but was not made by nas search; "
                             "choose another --study-name")
        time.sleep(POLL_S)
    stored = study.user_attrs["nas:identity"]
    if stored != ident:
        differ = sorted(k for k in set(stored) | set(ident) if stored.get(k) != ident.get(k))
        raise UsageError(f"study {config.study_name!r} in {config.storage} was created with other "
                         f"{', '.join(differ)} settings; re-run with those or choose a new --study-name")


# ----------------------------------------------------------------- choosing the next trial
@dataclass(frozen=True)
class Plan:
    params: dict[str, Any]
    user_attrs: dict[str, Any]


def _visited(trials: list[FrozenTrial]) -> set[tuple[str, int]]:
    """(shape key, seed) trained, being trained, or queued."""
    seen = set()
    for t in trials:
        ks = key_seed(t)
        if ks and (counts(t) or in_flight(t) or t.state == TrialState.WAITING):
            seen.add(ks)
    return seen


def plan_next(search: Search, trials: list[FrozenTrial]) -> Plan | None:
    """The next exhaustive member or replicate to enqueue; None lets the sampler propose."""
    if not search.exhaustive:
        return None
    seed = search.train.seed
    visited = _visited(trials)
    for arch in search.space:
        if (arch.key(), seed) not in visited:
            return Plan(search.space.params_of(arch), {"key": arch.key(), "seed": seed, "role": "member"})
    return plan_replicate(search, trials, visited)


def plan_replicate(search: Search, trials: list[FrozenTrial], visited: set[tuple[str, int]]) -> Plan:
    """A new seed for the least-replicated of: the baseline and the ``replicate_top`` best shapes (mean loss)."""
    losses: dict[str, list[float]] = defaultdict(list)
    archs: dict[str, ArchConfig] = {}
    for t in trials:
        if counts(t) and t.state == TrialState.COMPLETE:
            losses[t.user_attrs["key"]].append(loss_of(t))
            archs.setdefault(t.user_attrs["key"], arch_of(t))
    ranked = sorted(losses, key=lambda k: sum(losses[k]) / len(losses[k]))
    baseline = search.baseline
    candidates = [baseline.key()] + [k for k in ranked if k != baseline.key()][: search.config.replicate_top]
    archs.setdefault(baseline.key(), baseline)
    seeds = {k: {s for key, s in visited if key == k} for k in candidates}
    key = min(candidates, key=lambda k: (len(seeds[k]), candidates.index(k)))
    seed = next(s for s in range(search.train.seed, search.train.seed + 10**6) if s not in seeds[key])
    return Plan(search.space.params_of(archs[key]), {"key": key, "seed": seed, "role": "replicate"})


# ----------------------------------------------------------------- one trial
def _find_original(search: Search, key: str, seed: int, number: int, heartbeat: Heartbeat,
                   known: list[FrozenTrial] | None = None) -> FrozenTrial | None:
    """An earlier trial of the same (shape, seed) that counts; waits while a lower-numbered one may still train it.

    The lowest-numbered trial of a (shape, seed) trains it and the others wait for its result. A lower-numbered
    trial that has no shape yet (just handed out by ``ask`` to another worker) may be about to take this one,
    so it is waited for too: every trial records its shape before it gets here, so the wait is short.

    ``known``, the study as read just before this trial's ``ask``, answers without a new read when it is
    final below ``number``: it holds every lower-numbered trial (``number == len(known)``) and none of them
    was running, so none can still change or take this shape (the usual case with one worker).
    """
    final_below = known is not None and number == len(known) and not any(in_flight(t) for t in known)
    while True:
        trials = known if final_below else search.study.get_trials(deepcopy=False)
        same = [t for t in trials if t.number != number and key_seed(t) == (key, seed) and not is_duplicate(t)]
        done = [t for t in same if counts(t)]
        if done:
            return min(done, key=lambda t: t.number)
        if not any(in_flight(t) and t.number < number and key_seed(t) in (None, (key, seed)) for t in trials):
            return None
        _fail_stale(search.study)
        _fail_abandoned(search.study)
        time.sleep(POLL_S)


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _fail_abandoned(study: optuna.Study) -> None:
    """Fail (and re-queue, if it has a shape) every trial whose worker died before its first heartbeat.

    Called only while a worker waits on other trials, which is when such a trial would block it.
    """
    for trial_id in unbeaten_trial_ids(study, ABANDONED_AFTER_S):
        number = study._storage.get_trial_number_from_id(trial_id)
        try:
            study._storage.set_trial_user_attr(trial_id, "status", "abandoned")
            study._storage.set_trial_user_attr(trial_id, "reason", "its worker died before the first heartbeat")
            study._storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker got there first, or it just ended
            continue
        if "key" in study._storage.get_trial(trial_id).user_attrs:
            _requeue(study, number)


def _values(search: Search, arch: ArchConfig, loss: float, tokens_per_s: float) -> list[float]:
    pick = {"loss": loss, "params": float(arch.n_params()["total"]), "tokens_per_s": tokens_per_s}
    return [pick[o] for o in search.config.objectives]


def _answer_duplicate(search: Search, trial: optuna.Trial, original: FrozenTrial) -> str:
    copied = {name: original.user_attrs[name] for name in ("val_loss", "status", "reason", "tokens_per_s")
              if name in original.user_attrs}
    set_attrs(trial, {"duplicate_of": original.number, **copied})
    if original.state == TrialState.COMPLETE:
        search.study.tell(trial, original.values)
    elif original.state == TrialState.PRUNED:
        if original.intermediate_values and not search.multi_objective:
            step = max(original.intermediate_values)
            trial.report(original.intermediate_values[step], step)
        search.study.tell(trial, state=TrialState.PRUNED)
    else:
        search.study.tell(trial, state=TrialState.FAIL)
    return "duplicate"


def _train(search: Search, trial: optuna.Trial, arch: ArchConfig, seed: int, role: str) -> tuple[str, float | None]:
    may_prune = not search.multi_objective and role not in ("baseline", "replicate")
    final_tokens = search.train.steps * search.train.tokens_per_step  # the last report: the run has ended

    def report(tokens: int, loss: float) -> bool:
        if search.multi_objective:
            return False
        trial.report(loss, step=tokens)
        return may_prune and tokens < final_tokens and trial.should_prune()

    result = run_proxy(arch, search.train.with_(seed=seed), search.data, report)
    set_attrs(trial, result_attrs(result))
    if result.status == "ok":
        values = _values(search, arch, result.val_loss, result.tokens_per_s)
        search.study.tell(trial, values)
        return "complete", result.val_loss
    if result.status == "pruned":
        search.study.tell(trial, state=TrialState.PRUNED)
        return "pruned", result.val_loss
    search.study.tell(trial, state=TrialState.FAIL)
    return result.status, None


def _requeue(study: optuna.Study, number: int) -> None:
    """Put an interrupted trial's shape and seed back in the queue (same mechanism as for stale trials)."""
    frozen = study.get_trials(deepcopy=False)[number]
    attrs = {k: frozen.user_attrs[k] for k in ("key", "seed", "role") if k in frozen.user_attrs}
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, replace_user_attrs(frozen, attrs))


def _mark_interrupted(study: optuna.Study, trial: optuna.Trial) -> None:
    """Fail the trial as interrupted and re-queue its shape and seed (a trial told just before Ctrl-C stays as told)."""
    try:
        trial.set_user_attr("status", "interrupted")
        trial.set_user_attr("reason", "interrupted by the user (Ctrl-C); re-queued")
        study.tell(trial, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    if "key" in trial.user_attrs:
        _requeue(study, trial.number)


def replace_user_attrs(trial: FrozenTrial, user_attrs: dict[str, Any]) -> FrozenTrial:
    copy = optuna.trial.create_trial(state=TrialState.FAIL, params=trial.params, distributions=trial.distributions,
                                     user_attrs=user_attrs, system_attrs=trial.system_attrs)
    copy.number = trial.number
    return copy


@contextmanager
def _drawing_with(study: optuna.Study, sampler: optuna.samplers.BaseSampler | None) -> Iterator[None]:
    """Let ``sampler`` draw the trial's params: Optuna samples lazily, at each ``suggest_*`` call, not at ``ask``."""
    if sampler is None:
        yield
        return
    own, study.sampler = study.sampler, sampler
    try:
        yield
    finally:
        study.sampler = own


def run_trial(search: Search, trial: optuna.Trial, heartbeat: Heartbeat, plan: Plan | None = None,
              sampler: optuna.samplers.BaseSampler | None = None,
              known: list[FrozenTrial] | None = None) -> tuple[str, ArchConfig, int, str, float | None]:
    """Suggest (or read the enqueued) shape, de-duplicate, train, tell. Returns (state, arch, seed, role, loss).

    ``plan`` applies unless ``ask`` handed out a queued trial (which carries its own shape and seed);
    ``sampler`` (the plan's, or a random one that breaks a run of duplicates) draws the shape; ``known`` is
    the study as read before ``ask`` (see ``_find_original``).
    """
    given = dict(trial.user_attrs)  # a queued trial's own key, seed and role; else the plan's, if any
    if plan is not None and "key" not in given:
        given.update(plan.user_attrs)
    with _drawing_with(search.study, sampler):
        arch = search.space.suggest(trial)
    seed = int(given.get("seed", search.train.seed))
    role = given.get("role", "sampled")
    # one transaction (key, seed, role, shape): from now on other workers see what this trial trains; until
    # then a worker that draws the same shape waits for this lower-numbered, shapeless trial (_find_original)
    set_attrs(trial, shape_attrs(arch, seed, role))
    original = _find_original(search, arch.key(), seed, trial.number, heartbeat, known)
    if original is not None:
        return _answer_duplicate(search, trial, original), arch, seed, role, loss_of(original)
    state, loss = _train(search, trial, arch, seed, role)
    return state, arch, seed, role, loss


# ----------------------------------------------------------------- the worker loop
def summary(search: Search, trials: list[FrozenTrial]) -> tuple[int, tuple[int, float] | None, float | None]:
    """(counted trials, best shape as (its first trial, mean loss over its seeds), the baseline's mean loss).

    Shapes are compared by their mean over seeds, as in the leaderboard: one lucky seed is not a gain
    (and the baseline's own first seed must not show a gain over the baseline).
    """
    counted = [t for t in trials if counts(t)]
    losses: dict[str, list[float]] = defaultdict(list)
    first: dict[str, int] = {}
    for t in counted:
        if t.state == TrialState.COMPLETE:
            losses[t.user_attrs["key"]].append(loss_of(t))
            first.setdefault(t.user_attrs["key"], t.number)
    means = {key: sum(values) / len(values) for key, values in losses.items()}
    best = min(means, key=lambda key: (means[key], first[key]), default=None)
    return len(counted), ((first[best], means[best]) if best else None), means.get(search.baseline.key())


def run_worker(search: Search, on_event: Callable[[TrialEvent], None] | None = None) -> int:
    """Train trials until the study holds ``trials`` counted ones; returns how many this worker trained."""
    study, target = search.study, search.config.trials
    trained = duplicate_streak = error_streak = 0
    finished: tuple | None = None  # the last trial's outcome, told to ``on_event`` with the next read of the study
    while True:
        _fail_stale(study)
        trials = study.get_trials(deepcopy=False)
        if finished is not None and on_event is not None:
            on_event(_event(search, trials, *finished))
        finished = None
        counted = sum(counts(t) for t in trials)
        if counted >= target:
            return trained
        if counted + sum(in_flight(t) for t in trials) >= target:
            _fail_abandoned(study)
            time.sleep(POLL_S)  # the rest is running elsewhere; stay in case one of them fails
            continue
        plan = plan_next(search, trials)
        sampler = None
        if plan is not None:  # every parameter is fixed: a random base sampler is never asked, and unlike TPE
            # it does not read the study to infer a search space it would not use (one storage read less)
            sampler = optuna.samplers.PartialFixedSampler(plan.params, optuna.samplers.RandomSampler(seed=len(trials)))
        elif duplicate_streak >= MAX_DUPLICATE_STREAK:
            sampler = optuna.samplers.RandomSampler(seed=search.train.seed + len(trials))
        trial = study.ask()  # a queued trial if there is one, else a fresh one that ``plan`` or the sampler fills
        started = time.perf_counter()
        state, loss, reason = "error", None, None
        arch, seed, role = search.baseline, search.train.seed, "sampled"
        with Heartbeat(study, trial._trial_id) as heartbeat:
            try:
                if _may_be_surplus(trials, trial.number, target) and _is_surplus(study, trial.number, target):  # stand down, but stay: the others may still fail
                    trial.set_user_attr("surplus", True)
                    study.tell(trial, state=TrialState.FAIL)
                    if "key" in trial.user_attrs:  # a queued trial (e.g. a re-queued one) goes back to the queue
                        _requeue(study, trial.number)
                    continue
                state, arch, seed, role, loss = run_trial(search, trial, heartbeat, plan, sampler, trials)
            except KeyboardInterrupt:
                _mark_interrupted(study, trial)
                raise
            except UsageError:
                study.tell(trial, state=TrialState.FAIL)
                raise
            except Exception as error:  # noqa: BLE001 - recorded, and the study goes on
                reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
                try:
                    trial.set_user_attr("status", "error")
                    trial.set_user_attr("reason", reason)
                    study.tell(trial, state=TrialState.FAIL)
                except optuna.exceptions.UpdateFinishedTrialError:  # this process starved, its heartbeat went
                    state, reason = "stale", None  # stale: another worker failed and re-queued the trial
        trained += state not in ("duplicate", "error", "stale")
        duplicate_streak = duplicate_streak + 1 if state == "duplicate" else 0
        error_streak = error_streak + 1 if state == "error" else 0
        finished = (trial.number, role, arch, seed, state, loss, time.perf_counter() - started, reason)
        if error_streak >= MAX_ERROR_STREAK:
            if on_event is not None:
                on_event(_event(search, study.get_trials(deepcopy=False), *finished))
            raise SearchAborted(f"{MAX_ERROR_STREAK} trials in a row failed with an error; last: {reason}")


def _event(search: Search, trials: list[FrozenTrial], number: int, role: str, arch: ArchConfig, seed: int,
           state: str, loss: float | None, wall_time_s: float, reason: str | None) -> TrialEvent:
    """The progress event of trial ``number``, from a read of the study made after it was told."""
    n, best, base = summary(search, trials)
    reason = reason or (trials[number].user_attrs.get("reason") if state != "complete" else None)
    return TrialEvent(number, role, arch, seed, state, loss, wall_time_s, n, search.config.trials, best, base, reason)


def _may_be_surplus(before_ask: list[FrozenTrial], number: int, target: int) -> bool:
    """Cheap bound from the list read before ``ask``: can ``_is_surplus`` be true at all?

    Trials numbered below ``number`` are those in ``before_ask`` plus at most ``number - len(before_ask)``
    created since by other workers; if even counting all of those as ahead leaves room, the
    storage need not be read again.
    """
    ahead = sum(1 for t in before_ask if t.number < number and (counts(t) or in_flight(t)))
    return ahead + max(0, number - len(before_ask)) >= target


def _is_surplus(study: optuna.Study, number: int, target: int) -> bool:
    """Two workers raced for the last slot: the higher-numbered trial stands down."""
    trials = study.get_trials(deepcopy=False)
    ahead = sum(1 for t in trials if t.number < number and (counts(t) or in_flight(t)))
    return ahead >= target


# ----------------------------------------------------------------- several workers
def interruptible() -> None:
    """Make SIGINT and SIGTERM raise ``KeyboardInterrupt``: a clean stop, the running trial re-queued.

    A shell starts background jobs (``nas search ... &``, ``nohup``) with SIGINT ignored, and
    Python then leaves it ignored; ``kill -INT`` must still stop a search as Ctrl-C does in a
    terminal. SIGTERM (``kill``, a batch scheduler's notice before SIGKILL) stops it the same way
    instead of leaving the trial to be found stale after the heartbeat grace period.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminated)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is; unlike Ctrl-C in a terminal, it reached this process alone."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def _interrupt_workers(processes: list, queue: Any, grace_s: float = 3.0) -> None:
    """Pass an interrupt on to workers still running after ``grace_s``.

    Ctrl-C in a terminal reaches every worker at once (one process group), and the grace period
    lets them stop on their own; ``kill -INT`` or ``kill`` reaches only this process, and without
    this its workers would train on. After SIGTERM (``Terminated``) there is no grace period.
    """
    _wait_for_workers(processes, queue, timeout=grace_s)
    for p in processes:
        if p.is_alive():
            os.kill(p.pid, signal.SIGINT)


def _wait_for_workers(processes: list, queue: Any, timeout: float | None = None) -> None:
    """Wait for the workers to end, reading (and dropping) what they still send.

    A process that put items on a ``multiprocessing.Queue`` exits only once they are flushed into
    the pipe, so joining without reading can deadlock (Python's "joining processes that use queues").
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(p.is_alive() for p in processes) and (deadline is None or time.monotonic() < deadline):
        try:
            queue.get(timeout=POLL_S / 5)  # drained and dropped: the parent has stopped reporting
        except queue_module.Empty:
            continue  # nothing to drain this poll; check the workers again
    if deadline is None:
        for p in processes:
            p.join()


def _worker_main(config: SearchConfig, worker: int, queue: Any) -> None:
    interruptible()
    try:
        search = open_search(config, worker=worker, create=False)
        run_worker(search, lambda event: queue.put(("event", worker, event)))
        queue.put(("done", worker, None))
    except KeyboardInterrupt:
        queue.put(("interrupted", worker, None))
    except (UsageError, SearchAborted) as error:
        queue.put(("error", worker, str(error)))
    except Exception as error:  # noqa: BLE001 - the parent must hear of it, or it waits for this worker forever
        queue.put(("error", worker, f"{type(error).__name__}: {error}"))
        raise


def run_search(config: SearchConfig, on_event: Callable[[TrialEvent], None] | None = None,
               on_start: Callable[[Search], None] | None = None) -> Search:
    """Open (or resume) the study and run ``config.workers`` workers until it holds ``trials`` counted trials."""
    search = open_search(config)
    if on_start is not None:
        on_start(search)
    if config.workers == 1:
        run_worker(search, on_event)
        return search
    config = search.config  # carries the resolved study name
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_worker_main, args=(config, w, queue), daemon=False)
                 for w in range(config.workers)]
    for p in processes:
        p.start()
    errors, died, finished = [], [], set()
    try:
        while len(finished) < len(processes):
            try:
                kind, worker, payload = queue.get(timeout=POLL_S)
            except queue_module.Empty:  # everything sent has been read: a worker that is gone now was killed
                for worker, p in enumerate(processes):
                    if worker not in finished and not p.is_alive():
                        finished.add(worker)
                        died.append(f"worker {worker} died (exit code {p.exitcode}); its trial is re-queued "
                                    "once its heartbeat is stale")
                continue
            if kind == "event" and on_event is not None:
                on_event(payload)
            elif kind in ("done", "interrupted", "error"):
                finished.add(worker)
                if kind == "error":
                    errors.append(f"worker {worker}: {payload}")
    except KeyboardInterrupt as interrupt:
        _interrupt_workers(processes, queue, grace_s=0.0 if isinstance(interrupt, Terminated) else 3.0)
        raise
    finally:
        _wait_for_workers(processes, queue)
    if errors or (died and trials_done(search.study) < config.trials):
        raise SearchAborted("; ".join(errors + died))
    search.notes.extend(f"{message}; the other workers completed the study" for message in died)
    return search


def trials_done(study: optuna.Study) -> int:
    return sum(counts(t) for t in study.get_trials(deepcopy=False))


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
