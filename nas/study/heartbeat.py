"""A running trial's heartbeat, for ask/tell loops (Optuna starts one only inside ``study.optimize``).

While the context is open, a daemon thread records the trial's heartbeat in the storage
every ``heartbeat_interval`` seconds; a worker killed with SIGKILL stops beating, and the
next worker's ``fail_stale_trials`` fails and re-queues its trial after the grace period.

A beat can also fail while the worker lives (the database connection died, the disk is
full). After ``WARN_AFTER_FAILURES`` failures in a row the worker is warned on stderr: past
the grace period another worker will re-queue the trial. Each beat that gets through also
reads the trial's state; once it is no longer RUNNING (another worker failed it as stale
meanwhile, and its retry trains the shape) ``lost`` is set, and the worker stops training
and drops its result, so that no trial is finished twice.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from nas.study.signals import raise_if_stopped

WARN_AFTER_FAILURES = 3  # consecutive failed beats before the worker is warned


def warn_on_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class TrialLost(RuntimeError):
    """The trial was failed and re-queued by another worker while this one trained it: its result is dropped."""


class Heartbeat:
    """Context manager: beats for trial ``trial_id`` (number ``number``) while open; ``lost`` tells if it was taken."""

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int, number: int,
                 warn: Callable[[str], None] | None = None) -> None:
        interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        self._storage, self._trial_id, self._number, self._interval = storage, trial_id, number, interval
        self._warn = warn or (lambda message: warn_on_stderr(message))  # looked up at call time (tests replace it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()  # set once the trial is no longer RUNNING in the storage
        self.failures = 0  # consecutive failed beats, now

    def _beat_once(self) -> None:
        try:
            self._storage.record_heartbeat(self._trial_id)
            state = self._storage.get_trial(self._trial_id).state
        except Exception as error:  # noqa: BLE001 - a failed beat is counted, warned about and retried
            self.failures += 1
            if self.failures == WARN_AFTER_FAILURES:
                first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
                grace = getattr(self._storage, "grace_period", None) or 3 * (self._interval or 0)
                self._warn(f"the heartbeat of trial #{self._number} failed {self.failures} times in a row: "
                           f"{first}; after {grace} s without a beat another worker re-queues the trial, "
                           "and this worker then drops its result")
            return
        if self.failures >= WARN_AFTER_FAILURES:
            self._warn(f"the heartbeat of trial #{self._number} is back after {self.failures} failed beats")
        self.failures = 0
        if state != TrialState.RUNNING:
            self.lost.set()

    def _beat(self) -> None:
        while True:
            self._beat_once()
            if self.lost.is_set() or self._stop.wait(self._interval):
                return

    def lost_reason(self) -> str:
        return (f"trial #{self._number} was failed and re-queued by another worker while this one trained it "
                "(its heartbeat was lost); its retry trains the shape")

    def check(self) -> None:
        """Raise ``TrialLost`` if another worker has taken the trial (called between training steps), and a stop signal
        whose exception was swallowed (``nas.study.signals.raise_if_stopped``)."""
        raise_if_stopped()
        if self.lost.is_set():
            raise TrialLost(self.lost_reason())

    def __enter__(self) -> Heartbeat:
        if self._interval:
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self._trial_id}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
