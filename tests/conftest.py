"""Shared fixtures: one data cache for the whole session, one-thread searches, a throw-away PostgreSQL server."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def _pin_xdist_worker() -> None:
    """Under ``pytest -n N`` (pytest-xdist), worker ``i`` gets its own slice of the cores, before torch is imported.

    Each worker is then a serial lane of its own: its in-process trainings and the ``nas`` subprocesses its
    tests start (they inherit the affinity, or pin themselves inside it, ``search_helpers.on_cores``) never
    share a core with the other lane's. Two torch processes on one core wait on each other at every op."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cores = sorted(os.sched_getaffinity(0))
    index, lanes = int(worker.removeprefix("gw")), int(count)
    if lanes > len(cores):
        return
    share = cores[index * len(cores) // lanes:(index + 1) * len(cores) // lanes]
    os.sched_setaffinity(0, share)


_pin_xdist_worker()


@pytest.fixture(scope="session", autouse=True)
def nas_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test (and every subprocess it starts) shares one builtin-data cache, built once."""
    path = os.environ.get("NAS_TEST_CACHE") or str(tmp_path_factory.mktemp("nas-cache"))
    os.environ["NAS_CACHE"] = path
    return path


@pytest.fixture(scope="session")
def builtin_data(nas_cache: str):
    from nas.data.loading import load_data

    return load_data("builtin")


@pytest.fixture(scope="session")
def cpu_baseline_result(builtin_data):
    """One trial of the default `cpu` proxy's baseline on the built-in data, shared by the tests that read it."""
    from runners.presets import get_preset
    from runners.proxy import run

    preset = get_preset("cpu")
    return run(preset.baseline, preset.train, builtin_data)


@pytest.fixture
def fused_attention_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model takes the fused attention wherever it has a kernel, also on CPUs where it would not by default (no
    AVX-512: ``attention_kernels.fused_attention_pays``), so the tests of that path test it on every machine."""
    from nas.model import attention_kernels

    monkeypatch.setattr(attention_kernels, "FUSED_ATTENTION_FORCED", True)


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process searches train with one torch thread: on a busy 2-core box two threads wait on each other at
    every op (a tiny trial goes from 0.5 s to 50 s); the ``nas`` subprocesses get one core each instead."""
    import runners.cores

    monkeypatch.setattr(runners.cores, "available_cores", lambda: 1)


@pytest.fixture(autouse=True)
def stop_signals_as_they_were() -> Iterator[None]:
    """A test that makes this process ``interruptible`` (``nas.study.signals``), or sends it a stop signal, leaves the
    next test the handlers and the record of received signals it found."""
    from nas.study import signals

    handlers = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    yield
    for signum, handler in handlers.items():
        signal.signal(signum, handler)
    signals._received.clear()


# ----------------------------------------------------------------- PostgreSQL
def _postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[-3]))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    """A running throw-away server: its URL (no database), and a stop and start for fault tests."""

    url: str
    stop: Callable[[], None]
    start: Callable[[], None]


@pytest.fixture(scope="session")
def postgres_control() -> Iterator[PostgresServer]:
    """A throw-away PostgreSQL server on a temp dir and a loopback port (run as ``postgres`` when we are root)."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found (no initdb on PATH or in /usr/lib/postgresql/*/bin)")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="nas-pg-"))  # not pytest's tmp_path: the postgres user must reach it
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()

    def pg(tool: str, *args: str) -> None:
        subprocess.run([*as_user, str(bindir / tool), *args], check=True, capture_output=True, timeout=120)

    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
    pg("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
    pg("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "start", "-o", options)

    def stop() -> None:  # fast: every open connection is terminated, as when a server goes down for real
        pg("pg_ctl", "-D", str(data), "-w", "-t", "60", "-m", "fast", "stop")

    def start() -> None:
        pg("pg_ctl", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "start", "-o", options)

    try:
        yield PostgresServer(f"postgresql://postgres@127.0.0.1:{port}", stop, start)
    finally:
        pg("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server(postgres_control: PostgresServer) -> str:
    """The throw-away server's URL without a database."""
    return postgres_control.url


@pytest.fixture
def postgres_url(postgres_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the server, for one test."""
    import psycopg2

    name = request.node.name.lower()[:40].replace("-", "_")
    connection = psycopg2.connect(f"{postgres_server}/postgres")
    try:
        connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
        connection.cursor().execute(f'CREATE DATABASE "{name}"')
    finally:
        connection.close()
    return f"{postgres_server}/{name}"


# The modules that take longest, slowest first (seconds in one run of the suite on a 2-core AMD EPYC, fp32 matmul peak
# about 143 GFLOP/s). pytest-xdist's loadfile hands out whole files, by default those with most tests first: the
# load test (one test, three minutes) then ran alone at the end while the other lane sat idle. Longest first (with
# --no-loadscope-reorder in pyproject.toml) lets the two lanes finish together.
SLOWEST_FIRST = ("test_faults.py", "test_load.py", "test_search_concurrency.py", "test_benchmarks_smoke.py",
                 "test_full_run.py", "test_gpu_path.py", "test_fuzz.py", "test_search_resume.py", "test_hostile.py",
                 "test_search_e2e.py", "test_report_browser.py", "test_cli_rules.py", "test_hourglass_chain.py",
                 "test_rule_benchmarks.py", "test_docs.py", "test_rerun.py", "test_security.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


# ----------------------------------------------------------------- one tiny study a session
@pytest.fixture(scope="session")
def tiny_study_file(tmp_path_factory: pytest.TempPathFactory, nas_cache: str) -> Path:
    """A real 4-trial search of the tiny Prism space (study ``proxy``: every member once, then a replicate), made once
    a session; tests take a copy (``copy_study``) instead of searching again."""
    import runners.cores
    from nas.study.config import SearchConfig
    from nas.study.parallel import run_search
    from search_spaces.factory import SpaceOptions

    path = tmp_path_factory.mktemp("tiny-study") / "nas.db"
    with pytest.MonkeyPatch.context() as patch:  # one torch thread, as the one_thread fixture
        patch.setattr(runners.cores, "available_cores", lambda: 1)
        run_search(SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=f"sqlite:///{path}",
                                trials=4, study_name="proxy"))
    return path


@pytest.fixture
def tiny_study(tiny_study_file: Path, tmp_path: Path) -> str:
    """This test's own copy of the session's tiny study, in its ``tmp_path`` (``nas.db``): its storage URL."""
    from tests.search_helpers import copy_study

    return copy_study(tiny_study_file, tmp_path / "nas.db")
