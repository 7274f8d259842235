"""Shared by the ``nas search`` tests: running the CLI in a subprocess and reading a study back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas.study.records import counts, key_seed

NAS = [sys.executable, "-m", "nas"]  # as the console script enters it (nas.console)
TINY = ["--preset", "tiny"]
# the tiny preset's baseline (L4 d32 h4) gives a prism space of 3 members; six layers give 5
SPACE3 = ["--space", "prism"]
SPACE5 = ["--space", "prism", "--layers", "6"]


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def nas_env() -> dict[str, str]:
    """The test session's environment (its ``NAS_CACHE`` included), quiet about warnings."""
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def on_cores(cores: Iterable[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` pinning the process (and so torch's thread count) to ``cores``; None leaves it free.

    A trial uses every core it may run on; two such processes on one 2-core box, or one beside a busy
    neighbour, make torch's threads wait on each other at every op (100x slower), so tests pin them.
    """
    if cores is None:
        return None
    allowed = sorted(set(cores) & os.sched_getaffinity(0)) or sorted(os.sched_getaffinity(0))[:1]
    return lambda: os.sched_setaffinity(0, allowed)


def run_nas(*args: str, cwd: Path, timeout: float = 300, cores: Iterable[int] | None = (0,)
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NAS, *args], cwd=cwd, env=nas_env(), capture_output=True, text=True, timeout=timeout,
                          preexec_fn=on_cores(cores))


def start_nas(*args: str, cwd: Path, log: Path, cores: Iterable[int] | None = (0,),
              sigint_ignored: bool = False, niceness: int = 0) -> subprocess.Popen:
    """``nas ...`` in the background, stdout and stderr into ``log`` (a pipe could fill up and block it).

    ``sigint_ignored`` starts it as a shell starts a background job (``nas search ... &``): SIGINT ignored.
    ``niceness`` > 0 lowers its CPU priority (and its workers', which inherit it): writers that must not starve
    the readers a test times on the same core.
    """
    pin = on_cores(cores)

    def prepare() -> None:
        if pin is not None:
            pin()
        if niceness:
            os.nice(niceness)
        if sigint_ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([*NAS, *args], cwd=cwd, env=nas_env(), stdout=out, stderr=subprocess.STDOUT,
                                text=True, preexec_fn=prepare)


def stop(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        process.wait(timeout=30)


def load_trials(storage: str, study_name: str) -> list[FrozenTrial]:
    """The study's trials, read with plain Optuna (PostgreSQL through ``nas.study.storage``, which picks the driver)."""
    from nas.study.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = storage if storage.startswith("sqlite") else make_storage(storage)
    return optuna.load_study(study_name=study_name, storage=store).get_trials(deepcopy=False)


def study_names(storage: str) -> list[str]:
    return [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if counts(t)]


def assert_no_repeated_work(trials: list[FrozenTrial], target: int) -> None:
    """Exactly ``target`` counted trials, no two of them with the same (shape, seed), each with its result."""
    done = counted(trials)
    assert len(done) == target, [(t.number, t.state.name, t.user_attrs.get("status")) for t in trials]
    repeated = [ks for ks, n in Counter(key_seed(t) for t in done).items() if n > 1]
    assert not repeated, f"(shape, seed) trained twice: {repeated}"
    for t in done:
        # its result (the evaluation curve is empty when a run failed before its first evaluation)
        assert "status" in t.user_attrs and "eval_curve" in t.user_attrs, f"trial {t.number} lost its result"
        if t.user_attrs["status"] in ("ok", "pruned"):
            assert t.user_attrs["eval_curve"], f"trial {t.number} lost its evaluations"
        if t.state == TrialState.COMPLETE:
            assert t.values and t.values[0] == t.user_attrs["val_loss"], f"trial {t.number} lost its value"
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], "a trial was left RUNNING"
    for t in trials:
        if "duplicate_of" in t.user_attrs:
            original = trials[t.user_attrs["duplicate_of"]]
            assert counts(original) and key_seed(original) == key_seed(t), (t.number, original.number)


def wait_for(condition: Callable[[], object], timeout: float, what: str, poll: float = 0.2,
             process: subprocess.Popen | None = None, log: Path | None = None) -> object:
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` (and the log) on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:  # noqa: BLE001 - the storage may not exist yet
            value = None
        if value:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited ({process.returncode}) before {what}:\n"
                                 + (log.read_text() if log else ""))
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f":\n{log.read_text()}" if log else ""))


def pop_queued_trials(url: str, study_name: str, asks: int, start_at: float, out: str) -> None:
    """A worker process for the queue race: ``asks`` times ``study.ask()`` from ``start_at`` on, numbers to ``out``."""
    import json

    from nas.study.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=make_storage(url))
    while time.time() < start_at:  # all workers ask at once
        time.sleep(0.001)
    numbers = [study.ask().number for _ in range(asks)]
    Path(out).write_text(json.dumps(numbers))


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def child_pids(pid: int) -> list[int]:
    """The worker processes ``multiprocessing`` started for ``pid``: spawned ones are its children, ones forked from
    its fork server (``nas.study.parallel.worker_context``) that server's; not the resource tracker."""
    workers = []
    for child in _children(pid):
        command = Path(f"/proc/{child}/cmdline").read_text()
        if "spawn_main" in command:
            workers.append(child)
        elif "forkserver" in command:
            workers += _children(child)
    return workers


def open_storage_at(url: str, start_at: float, out: str) -> None:
    """A worker process for the first-start race: open ``url`` at ``start_at``; "ok" or the one-line error
    to ``out``."""
    from nas.errors import UsageError
    from nas.study.storage import make_storage

    while time.time() < start_at:
        time.sleep(0.001)
    try:
        make_storage(url)
        Path(out).write_text("ok")
    except UsageError as error:
        Path(out).write_text(str(error))


def copy_study(source: Path, target: Path) -> str:
    """A consistent copy of an SQLite study (its write-ahead log included: SQLite's backup API), as a storage URL."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
    return f"sqlite:///{target}"
