"""The worker loop: fail stale trials, stop at the target, otherwise choose the next piece of work and run it.

A worker repeats until the study holds ``trials`` counted trials:

1. waiting trials first (the baseline, enqueued as trial 0; re-queued killed/interrupted trials):
   they are the only trials in Optuna's queue, so a re-queued shape is never left behind;
2. a space with no more members than ``trials`` is walked exhaustively, then replicated
   (``nas.study.planning``; the planned shape is drawn through a ``PartialFixedSampler``);
3. otherwise the sampler (TPE by default) proposes a shape.

Workers on any number of machines share one study through the storage (Optuna's own model).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.arch import ArchConfig
from nas.errors import SearchAborted, UsageError
from nas.stats.board import rank_shapes
from nas.study.heartbeat import Heartbeat, TrialLost, warn_on_stderr
from nas.study.liveness import lease
from nas.study.optuna_internals import trial_id
from nas.study.planning import plan_next
from nas.study.records import counts, in_flight, scores_by_shape
from nas.study.recovery import fail_abandoned, fail_stale, mark_interrupted, mark_stopped, requeue
from nas.study.session import Search
from nas.study.signals import interrupts_deferred, raise_if_stopped
from nas.study.storage_faults import storage_failure, wait_for_storage
from nas.study.trial import POLL_S, run_trial

LOST_CONNECTION = "the storage connection was lost while it ran; re-queued"
MAX_ERROR_STREAK = 3  # trials in a row crashing with an error (not a result) stop the worker


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
    best: tuple[int, float] | None  # the best shape: (its first trial's number, seed-adjusted loss)
    baseline: float | None  # the baseline's mean loss over its seeds
    reason: str | None = None
    device: str = "cpu"  # the machine's device the trial trained on


def summary(search: Search, trials: list[FrozenTrial]) -> tuple[int, tuple[int, float] | None, float | None]:
    """(counted trials, best shape as (its first trial, ranked loss), the baseline's mean loss).

    Shapes are ranked as in the leaderboard (``nas.stats.board.ranking``: the baseline's mean plus the shape's
    paired difference shrunk by what its seeds support): one lucky seed is not a gain (and the baseline's own first
    seed must not show a gain over the baseline).
    """
    scores = scores_by_shape(trials)
    board = rank_shapes(scores, search.baseline.key(), intervals=False)
    ranked = board.ranked
    best = scores[board.order[0]] if board.order else None
    baseline = scores.get(search.baseline.key())
    return (sum(counts(t) for t in trials), (best.first_trial, ranked[best.key]) if best else None,
            baseline.mean if baseline else None)


StudyNote = Callable[[optuna.Study, bool], None]  # (study, force): refresh what a reader sees of the study


def run_worker(search: Search, on_event: Callable[[TrialEvent], None] | None = None,
               note: StudyNote | None = None) -> int:
    """Train trials until the study holds ``trials`` counted ones; returns how many this worker trained.

    ``note`` (the command line passes the dashboard's study note, ``reports.dashboard_note.NoteRefresher``) is
    called after each trial and once, forced, at the end; the search loop itself never imports the report. The
    process holds its study's lease (``nas.study.liveness``) meanwhile: a search that starts while it lives leaves
    its running trials alone."""
    with lease(search.config.storage):
        return _train_until_done(search, on_event, note)


def _train_until_done(search: Search, on_event: Callable[[TrialEvent], None] | None,
                      note: StudyNote | None) -> int:
    study, target = search.study, search.config.trials
    trained = duplicate_streak = error_streak = 0
    finished: tuple | None = None  # the last trial's outcome, told to ``on_event`` with the next read of the study
    while True:
        trial: optuna.Trial | None = None
        try:
            raise_if_stopped()  # a stop whose exception Python swallowed (nas.study.signals)
            fail_stale(study, search.storage, search.study_id)
            trials = study.get_trials(deepcopy=False)
            if finished is not None and on_event is not None:
                on_event(_event(search, trials, *finished))
            finished = None
            counted = sum(counts(t) for t in trials)
            if counted >= target:
                refresh_note(note, study, force=True)
                return trained
            if counted + sum(in_flight(t) for t in trials) >= target:
                fail_abandoned(study, search.storage, search.study_id)
                time.sleep(POLL_S)  # the rest is running elsewhere; stay in case one of them fails
                continue
            plan = plan_next(search, trials)
            with interrupts_deferred():  # a signal inside ``ask`` is delivered once ``trial`` holds what it made
                trial = study.ask()  # a queued trial if there is one, else a fresh one that ``plan`` or a sampler fills
            started = time.perf_counter()
            state, loss, reason = "error", None, None
            arch, seed, role = search.baseline, search.train.seed, "sampled"
            with Heartbeat(search.storage, trial_id(trial), trial.number) as heartbeat:
                try:
                    if _may_be_surplus(trials, trial.number, target) and _is_surplus(study, trial.number, target):
                        # stand down, but stay: the others may still fail
                        trial.set_user_attr("surplus", True)
                        study.tell(trial, state=TrialState.FAIL)
                        if "key" in trial.user_attrs:  # a queued trial (e.g. a re-queued one) goes back to the queue
                            requeue(study, trial.number)
                        continue
                    state, arch, seed, role, loss = run_trial(search, trial, heartbeat, plan, duplicate_streak, trials)
                except TrialLost as lost:  # another worker failed it as stale and re-queued it: nothing to tell
                    state, reason = "stale", str(lost)
                except UsageError:
                    study.tell(trial, state=TrialState.FAIL)
                    raise
                except Exception as error:
                    if storage_failure(error) is not None:
                        raise  # the storage, not the trial, failed: handled below
                    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
                    try:
                        trial.set_user_attr("status", "error")
                        trial.set_user_attr("reason", reason)
                        study.tell(trial, state=TrialState.FAIL)
                    except optuna.exceptions.UpdateFinishedTrialError:  # this process starved, its heartbeat went
                        state, reason = "stale", heartbeat.lost_reason()  # another worker failed and re-queued it
            trained += state not in ("duplicate", "error", "stale")
            if state not in ("duplicate", "error", "stale"):
                refresh_note(note, study)
            duplicate_streak = duplicate_streak + 1 if state == "duplicate" else 0
            error_streak = error_streak + 1 if state == "error" else 0
            finished = (trial.number, role, arch, seed, state, loss, time.perf_counter() - started, reason)
            if error_streak >= MAX_ERROR_STREAK:
                if on_event is not None:
                    on_event(_event(search, study.get_trials(deepcopy=False), *finished))
                raise SearchAborted(f"{MAX_ERROR_STREAK} trials in a row failed with an error; last: {reason}")
        except KeyboardInterrupt as stop:
            # anywhere from ``ask`` on (a trial told already is left as told): re-queued, a second signal held off
            if trial is not None:
                with interrupts_deferred():
                    mark_stopped(study, trial, stop)
            raise
        except Exception as error:
            failure = storage_failure(error)
            if failure is None:
                raise
            try:
                wait_for_storage(search.storage, search.config.storage, failure)  # or StorageUnavailable: one line
            except KeyboardInterrupt:  # stopped while the storage is away: the trial cannot be marked now
                if trial is not None:
                    warn_on_stderr(f"could not mark trial {trial.number} interrupted (the storage is unreachable); "
                                   "the next run of the same command re-queues it")
                raise
            if trial is not None:  # what it held goes back to the queue with its shape and seed
                mark_interrupted(study, trial, reason=LOST_CONNECTION)
            finished = None


def refresh_note(note: StudyNote | None, study: optuna.Study, force: bool = False) -> None:
    """Refresh the study's note; a failure is a warning, never a reason to stop the search."""
    if note is None:
        return
    try:
        note(study, force)
    except Exception as error:  # noqa: BLE001 - the note is a convenience; the trials are what matters
        warn_on_stderr(f"could not refresh the study's dashboard note: {type(error).__name__}: {error}"[:300])


def _event(search: Search, trials: list[FrozenTrial], number: int, role: str, arch: ArchConfig, seed: int,
           state: str, loss: float | None, wall_time_s: float, reason: str | None) -> TrialEvent:
    """The progress event of trial ``number``, from a read of the study made after it was told."""
    n, best, base = summary(search, trials)
    reason = reason or (trials[number].user_attrs.get("reason") if state != "complete" else None)
    return TrialEvent(number, role, arch, seed, state, loss, wall_time_s, n, search.config.trials, best, base, reason,
                      search.device_label)


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


def trials_done(study: optuna.Study) -> int:
    """Counted trials in the study (see ``nas.study.records.counts``)."""
    return sum(counts(t) for t in study.get_trials(deepcopy=False))
