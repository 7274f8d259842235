"""A running trial's heartbeat, for ask/tell loops (Optuna starts one only inside ``study.optimize``).

While the context is open, a daemon thread records the trial's heartbeat in the storage
every ``heartbeat_interval`` seconds; a worker killed with SIGKILL stops beating, and the
next worker's ``fail_stale_trials`` fails and re-queues its trial after the grace period.
"""

from __future__ import annotations

import threading

import optuna


class Heartbeat:
    def __init__(self, study: optuna.Study, trial_id: int) -> None:
        storage = study._storage  # the storage object Optuna itself beats through
        interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        self._storage, self._trial_id, self._interval = storage, trial_id, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        while True:
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception:  # noqa: BLE001 - a missed beat is retried; the trial itself goes on
                pass
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> "Heartbeat":
        if self._interval:
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{self._trial_id}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
