"""Trials whose worker is gone: failed as stale or abandoned, interrupted by the user, and re-queued.

A re-queued trial is a new WAITING trial with the same shape key, seed and role; the next
``ask()`` of any worker takes it (Optuna's queue), so no shape is left behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from nas.study.heartbeat import warn_on_stderr
from nas.study.optuna_internals import drop_connections, stale_trial_ids, trial_id, unbeaten_trial_ids
from nas.study.signals import Terminated, interrupts_deferred
from nas.study.storage_faults import first_line, storage_failure

ABANDONED_AFTER_S = 120.0  # a RUNNING trial this old that never beat was abandoned (worker died right after ask)


STALE_REASON = "its heartbeat stopped: its worker was killed, or lost the storage, while it trained"


def fail_stale(study: optuna.Study, storage: optuna.storages.BaseStorage, study_id: int) -> int:
    """Optuna's heartbeat check (``optuna.storages.fail_stale_trials``) with the reason recorded: fail each trial
    whose heartbeat is older than the storage's grace period as abandoned, then re-queue it through the storage's
    stale-trial callback (its retries bounded there), with its shape, seed and role; returns how many."""
    failed = []
    retry = storage.get_heartbeat_stale_trial_callback()  # type: ignore[attr-defined]
    for stale in stale_trial_ids(storage, study_id):
        with interrupts_deferred():  # a Ctrl-C between the fail and the re-queue would lose the shape
            if not _fail_as_abandoned(storage, stale, STALE_REASON):
                continue
            failed.append(stale)
            if retry is not None:
                frozen = storage.get_trial(stale)
                retry(study, replace_user_attrs(frozen, {k: frozen.user_attrs[k] for k in ("key", "seed", "role")
                                                         if k in frozen.user_attrs}))
    return len(failed)


def fail_abandoned(study: optuna.Study, storage: optuna.storages.BaseStorage, study_id: int,
                   older_than_s: float | None = None) -> None:
    """Fail (and re-queue, if it has a shape) every trial whose worker died before its first heartbeat.

    Called only while a worker waits on other trials, which is when such a trial would block it.
    """
    older_than_s = ABANDONED_AFTER_S if older_than_s is None else older_than_s
    for unbeaten in unbeaten_trial_ids(storage, study_id, older_than_s):
        _fail_and_requeue(study, storage, unbeaten, "its worker died before the first heartbeat")


def fail_orphaned(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int:
    """Fail (and re-queue, if it has a shape) every trial of ``study`` still RUNNING; returns how many.

    Only for a search that holds its study's lock file alone (``nas.study.liveness.alone``): no worker on any
    machine sharing the file is alive then, so each such trial was left by a dead process (killed, or stopped by a
    full disk), and waiting for its heartbeat to go stale, or for ``ABANDONED_AFTER_S`` when it never beat, would
    only delay its retry."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in running:
        with interrupts_deferred():  # a Ctrl-C between the fail and the re-queue would lose the shape
            _fail_and_requeue(study, storage, trial_id(trial),
                              "its search process was gone when the next search of this study started")
    return len(running)


def _fail_as_abandoned(storage: optuna.storages.BaseStorage, running: int, reason: str) -> bool:
    """Record ``reason`` on the running trial whose storage id is ``running`` and fail it as abandoned; False where
    another worker failed it first, or it just ended."""
    try:
        storage.set_trial_user_attr(running, "status", "abandoned")
        storage.set_trial_user_attr(running, "reason", reason)
        storage.set_trial_state_values(running, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    return True


def _fail_and_requeue(study: optuna.Study, storage: optuna.storages.BaseStorage, running: int, reason: str) -> None:
    """Fail the running trial whose storage id is ``running`` as abandoned with ``reason``; re-queue its shape and
    seed if it has them."""
    number = storage.get_trial_number_from_id(running)
    if not _fail_as_abandoned(storage, running, reason):
        return
    if "key" in storage.get_trial(running).user_attrs:
        requeue(study, number)


def requeue(study: optuna.Study, number: int) -> None:
    """Put an interrupted trial's shape and seed back in the queue (same mechanism as for stale trials)."""
    frozen = study.get_trials(deepcopy=False)[number]
    attrs = {k: frozen.user_attrs[k] for k in ("key", "seed", "role") if k in frozen.user_attrs}
    optuna.storages.RetryHeartbeatStaleTrialCallback()(study, replace_user_attrs(frozen, attrs))


INTERRUPTED = "interrupted (Ctrl-C or kill -INT); re-queued"
TERMINATED = "stopped by SIGTERM (kill, a scheduler's notice); re-queued"


def mark_interrupted(study: optuna.Study, trial: optuna.Trial, reason: str = INTERRUPTED) -> None:
    """Fail the trial as interrupted and re-queue its shape and seed (a trial told just before Ctrl-C stays as told).

    Each step is retried while SQLite answers "database is locked" (``BUSY_ATTEMPTS``): a signal that cut a storage
    call short can leave that call's transaction open, or a statement pending on its pooled connection, so the
    session and the pooled connections are dropped before each try (``nas.study.optuna_internals.drop_connections``)."""

    def fail() -> None:
        trial.set_user_attr("status", "interrupted")
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=TrialState.FAIL)

    try:
        _while_busy(study, fail)
    except optuna.exceptions.UpdateFinishedTrialError:
        return
    if "key" in study.get_trials(deepcopy=False)[trial.number].user_attrs:  # its shape was recorded: retry it
        _while_busy(study, lambda: requeue(study, trial.number))


def mark_stopped(study: optuna.Study, trial: optuna.Trial, stop: KeyboardInterrupt | None = None) -> None:
    """``mark_interrupted`` for a worker that is stopping (Ctrl-C, SIGTERM: ``stop``, whose kind the reason names): a
    storage that fails to take the mark is said in one line, not raised over the stop. Nothing is lost: the trial
    stays RUNNING with its heartbeat stopped, so the next run of the same command fails it as stale and re-queues its
    shape and seed (``fail_stale``)."""
    try:
        mark_interrupted(study, trial, TERMINATED if isinstance(stop, Terminated) else INTERRUPTED)
    except Exception as error:
        failure = storage_failure(error)
        if failure is None:
            raise
        warn_on_stderr(f"could not mark trial {trial.number} interrupted ({first_line(failure)}); its heartbeat has "
                       "stopped, so the next run of the same command fails it as stale and re-queues it")


BUSY_ATTEMPTS = 5


def _while_busy(study: optuna.Study, step: Callable[[], None]) -> None:
    """``step()``, tried again up to ``BUSY_ATTEMPTS`` times while the storage reports SQLite's busy lock."""
    for attempt in range(1, BUSY_ATTEMPTS + 1):
        drop_connections(study)
        try:
            step()
            return
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.OperationalError) as error:
            if attempt == BUSY_ATTEMPTS or not _busy(error):
                raise
            time.sleep(0.2 * attempt)


def _busy(error: BaseException | None) -> bool:
    """Whether SQLite's "database is locked" is anywhere in ``error``'s chain of causes."""
    for _ in range(16):  # a chain is a few links long; the bound guards against a cycle
        if error is None:
            return False
        if "database is locked" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def replace_user_attrs(trial: FrozenTrial, user_attrs: dict[str, Any]) -> FrozenTrial:
    copy = optuna.trial.create_trial(state=TrialState.FAIL, params=trial.params, distributions=trial.distributions,
                                     user_attrs=user_attrs, system_attrs=trial.system_attrs)
    copy.number = trial.number
    return copy
