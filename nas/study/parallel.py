"""Several workers on one machine (``--workers N``) and the signals that stop a search cleanly.

``run_search`` opens the study and either runs the worker loop itself (one worker) or spawns
N worker processes that share the study through the storage, relays their progress events,
and reports a worker that died. SIGINT and SIGTERM raise ``KeyboardInterrupt`` in every
process, so the running trial is marked interrupted and re-queued and the same command resumes.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue as queue_module
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nas.errors import UsageError
from nas.study.config import SearchConfig
from nas.study.liveness import alone
from nas.study.placement import Placement, apply_placement, cpu_cores, gpu_count, plan_placements, resolve_workers
from nas.study.recovery import fail_orphaned, fail_stale
from nas.study.session import Search, open_search
from nas.study.signals import STOP_SIGNALS, Terminated, interruptible, raise_if_stopped
from nas.study.trial import POLL_S
from nas.study.worker import SearchAborted, StudyNote, TrialEvent, refresh_note, run_worker, trials_done
from runners.allocator import keep_freed_memory
from runners.orphans import die_with_parent
from runners.presets import get_preset


def _interrupt_workers(processes: list, terminated: bool = False) -> None:
    """Pass a stop on to the workers still running, at once: the signal this process received, so each trial
    records it.

    ``kill -INT`` or ``kill`` reaches only this process: a grace period of 3 s, meant for a terminal's Ctrl-C (which
    reaches every worker of the group), let the workers of a ``kill -INT`` finish their trials and start new ones
    after the stop, whose lines were never printed. A worker takes a second stop signal as part of the first
    (``nas.study.signals.interruptible(once=True)``), so a terminal's Ctrl-C passed on as well is one stop.
    """
    for p in processes:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM if terminated else signal.SIGINT)


def _wait_for_workers(processes: list, queue: Any) -> None:
    """Wait for the workers to end, reading (and dropping) what they still send.

    A process that put items on a ``multiprocessing.Queue`` exits only once they are flushed into
    the pipe, so joining without reading can deadlock (Python's "joining processes that use queues").
    """
    while any(p.is_alive() for p in processes):
        try:
            queue.get(timeout=POLL_S / 5)  # drained and dropped: the parent has stopped reporting
        except queue_module.Empty:
            continue  # nothing to drain this poll; check the workers again
    for p in processes:
        p.join()


def placements(config: SearchConfig) -> list[Placement]:
    """Where each of the search's local workers trains (``nas.study.placement``), ``--workers auto`` resolved."""
    overrides = dict(config.train_overrides)
    device = overrides.get("device") or get_preset(config.preset).train.device
    n_gpus = gpu_count() if device != "cpu" and device != "mps" else 0
    cores = cpu_cores()
    workers = resolve_workers(config.workers, device, n_gpus, cores)
    return plan_placements(workers, device, n_gpus, cores, overrides.get("threads") or 0,
                           os.environ.get("CUDA_VISIBLE_DEVICES"))


def placed(config: SearchConfig, placement: Placement, workers: int) -> SearchConfig:
    """``config`` as worker ``placement.worker`` runs it: its device and threads (run-only: the study is the same)."""
    overrides = tuple((k, v) for k, v in config.train_overrides if k not in ("device", "threads"))
    device = () if placement.device in ("auto", "cpu") and "device" not in dict(config.train_overrides) \
        else (("device", placement.device),)
    return replace(config, workers=workers, train_overrides=(*overrides, *device, ("threads", placement.threads)))


def _worker_main(config: SearchConfig, worker: int, queue: Any, placement: Placement | None = None,
                 note: StudyNote | None = None, environment: dict[str, str] | None = None) -> None:
    # a worker outliving a SIGKILLed parent would hold its trial with live heartbeats (never found stale)
    # while nothing reads its events: it dies with the search, and its trial is retried like any killed one
    die_with_parent()  # a spawned worker's parent is the search
    parent = multiprocessing.parent_process()
    if parent is not None:
        die_with_search(parent)  # a forked one's is the fork server, which outlives the search
    if environment is not None:  # the parent's environment now, not the fork server's at its start
        os.environ.clear()
        os.environ.update(environment)
    if placement is not None:
        apply_placement(placement)  # before anything in this process initialises CUDA
    keep_freed_memory()  # the allocator a training process runs best with (runners.allocator)
    interruptible(once=True)  # one stop signal reaches a worker twice (nas.study.signals.interruptible)
    try:
        if hasattr(signal, "pthread_sigmask"):  # blocked from the fork server (start_fork_server); Windows has none
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        search = open_search(config, worker=worker, create=False)
        search.device_label = placement.label if placement is not None else search.device_label
        run_worker(search, lambda event: queue.put(("event", worker, event)), note)
        queue.put(("done", worker, None))
    except KeyboardInterrupt:
        queue.put(("interrupted", worker, None))
    except (UsageError, SearchAborted) as error:
        queue.put(("error", worker, str(error)))
    except Exception as error:
        queue.put(("error", worker, f"{type(error).__name__}: {error}"))
        raise


def die_with_search(search: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL this worker as soon as ``search``, the process that started it, dies (exit at once if it has).

    ``die_with_parent`` (``PR_SET_PDEATHSIG``) ties a process to its parent, which for a worker forked from the fork
    server is the server, not the search; and the server outlives a SIGKILLed search, since each worker holds the
    write end of the pipe whose end tells the server its clients are gone (CPython hands it to every child): server
    and workers would train on, orphaned, racing the resumed search. A daemon thread waits on the search's sentinel
    (the pipe it keeps open for this child; ``multiprocessing.parent_process()``), then kills this process as the
    kernel would for a spawned one."""

    def watch() -> None:
        multiprocessing.connection.wait([search.sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    if not search.is_alive():
        os._exit(1)
    threading.Thread(target=watch, name="die-with-search", daemon=True).start()


# what every worker imports, imported once in the fork server that CPU workers are forked from
WORKER_MODULES = ["torch", "nas.study.parallel", "nas.study.worker", "runners.proxy",
                  "nas.model.transformer"]


def worker_context(places: list[Placement]) -> Any:
    """The multiprocessing context the workers start in.

    CPU workers are forked from a fork server that has imported ``WORKER_MODULES`` once: a spawned worker imported
    torch itself, and at its optimizer's first step torch._dynamo (no longer: ``runners.optimizer``), ~2.3
    CPU-seconds a worker on a 2-core Xeon (fp32 matmul peak 344 GFLOP/s), more on a 2-core EPYC; the test files of
    multi-worker searches took 35 % less CPU. The
    fork server is single-threaded but for the BLAS pools of numpy and scipy, which are fork-safe, and starts no torch
    thread pool. Workers on a GPU are spawned: a process forked after anything has touched CUDA cannot use it, and
    spawn is the path the GPU checks passed on. So is every worker off Linux: Windows has no fork, and on macOS a
    fork after its system frameworks started (Accelerate, under numpy) is not safe, which is why Python spawns there."""
    if any(p.label != "cpu" for p in places) or not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_MODULES)
    return context


def start_fork_server(context: Any) -> None:
    """Start the fork server (if ``context`` uses one) with SIGINT and SIGTERM blocked, a mask that survives ``exec``.

    CPython's server ignores Ctrl-C only once it has imported its preload (torch: seconds), so a Ctrl-C in a
    terminal (it reaches the whole process group) during that import printed the server's ``KeyboardInterrupt``
    traceback under the search's one line; and its workers start with the server's handlers, so one that came
    before a worker installed its own raised outside its ``try``. Blocked, the signal waits: this process unblocks
    at once (one that came meanwhile is delivered here, as it came), and each worker unblocks inside its ``try``
    (``_worker_main``)."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def kill_fork_server(context: Any) -> None:
    """SIGKILL the fork server (its workers die with it: ``die_with_parent``) and reap it, for a search stopped while
    starting its workers: asked to stop, the server would first serve the starts it holds, forking workers after the
    search has gone (with a traceback: what they unpickle is gone too). CPython's private ``_forkserver_pid``, as
    ``stop_fork_server`` uses its ``_stop``; absent, nothing is done."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop_fork_server(context)  # reaps it and forgets it: the next search in this process starts a new one


def stop_fork_server(context: Any) -> None:
    """End the fork server once the search's workers have: it reaped them, so once this process reaps it, its
    ``RUSAGE_CHILDREN`` covers the workers (the search's last line states the largest process's peak memory, as
    ``/usr/bin/time`` would), and no idle server holding torch outlives the search in a long-lived process. The next
    search in this process starts a new one. CPython's ``ForkServer._stop`` (its own tests' way; absent, it stays)."""
    if context.get_start_method() != "forkserver":
        return
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def requeue_orphans(search: Search) -> None:
    """Where no search of the study's file is alive (``nas.study.liveness.alone``), re-queue at once the trials that
    a dead one left running, and say so among the search's notes."""
    with alone(search.config.storage) as only:
        orphans = fail_orphaned(search.study, search.storage) if only else 0
    if orphans:
        search.notes.append(f"{orphans} trial{'s' if orphans > 1 else ''} left running by a search that is gone "
                            f"{'were' if orphans > 1 else 'was'} re-queued")
    stale = fail_stale(search.study, search.storage, search.study_id)  # another machine's, or where no lock is kept
    if stale:
        search.notes.append(f"{stale} trial{'s' if stale > 1 else ''} whose heartbeat had stopped (a worker killed, or "
                            f"cut off from the storage) {'were' if stale > 1 else 'was'} failed, and re-queued "
                            "where its retries allow")


def run_search(config: SearchConfig, on_event: Callable[[TrialEvent], None] | None = None,
               on_start: Callable[[Search], None] | None = None, note: StudyNote | None = None) -> Search:
    """Open (or resume) the study and run ``config.workers`` workers until it holds ``trials`` counted trials.

    Each worker trains where ``placements`` puts it; a single worker runs in this process. ``note`` (picklable: it
    goes to worker 0's process) refreshes the study's note for readers (``nas.study.worker.run_worker``): one writer
    is enough, as every worker returns only once the study is complete, and the others are spared its imports and
    its fits (a second of CPU or more a worker); if worker 0 died, this process writes the final note. A study that
    already holds its trials starts no worker (nor the fork server: ~3.5 s of a resumed 200-trial study's 5.4 s):
    this process fails the stale trials and writes the note, as a worker would before it returned."""
    config.validate()
    places = placements(config)
    workers = len(places)
    search = open_search(placed(config, places[0], workers) if workers == 1 else replace(config, workers=workers))
    search.placements = places
    search.device_label = places[0].label
    if rounded := search.train.whole_steps_note():
        search.notes.append(rounded)
    requeue_orphans(search)
    if on_start is not None:
        on_start(search)
    if workers == 1:
        keep_freed_memory()
        run_worker(search, on_event, note)
        return search
    config = search.config  # carries the resolved study name
    if trials_done(search.study) >= config.trials:  # complete already: what each worker would do, and return
        fail_stale(search.study, search.storage, search.study_id)
        refresh_note(note, search.study, force=True)
        return search
    context = worker_context(places)
    queue = context.Queue()
    environment = dict(os.environ)
    processes = [context.Process(target=_worker_main, daemon=False,
                                 args=(placed(config, p, workers), p.worker, queue, p, note if i == 0 else None,
                                       environment))
                 for i, p in enumerate(places)]
    try:
        start_fork_server(context)
        for p in processes:
            p.start()
    except KeyboardInterrupt:  # a start the server has not served yet would fork a worker once this search is gone
        kill_fork_server(context)
        raise
    errors, died, finished = [], [], set()
    try:
        while len(finished) < len(processes):
            raise_if_stopped()  # a stop whose exception Python swallowed (nas.study.signals)
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
        _interrupt_workers(processes, terminated=isinstance(interrupt, Terminated))
        raise
    finally:
        _wait_for_workers(processes, queue)
        stop_fork_server(context)
    if errors or (died and trials_done(search.study) < config.trials):
        raise SearchAborted("; ".join(errors + died))
    if note is not None and processes[0].exitcode != 0:  # worker 0, the note's writer, did not finish it
        refresh_note(note, search.study, force=True)
    search.notes.extend(f"{message}; the other workers completed the study" for message in died)
    return search
