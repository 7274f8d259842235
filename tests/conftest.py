"""Shared fixtures: one data cache for the whole session, quiet Optuna."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def nas_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every test (and every subprocess it starts) shares one builtin-data cache, built once."""
    path = os.environ.get("NAS_TEST_CACHE") or str(tmp_path_factory.mktemp("nas-cache"))
    os.environ["NAS_CACHE"] = path
    return path


@pytest.fixture(scope="session")
def builtin_data(nas_cache: str):
    from nas.data import load_data

    return load_data("builtin")


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process searches train with one torch thread: on a busy 2-core box two threads wait on each other at
    every op (a tiny trial goes from 0.5 s to 50 s); the ``nas`` subprocesses get one core each instead."""
    import runners.device

    monkeypatch.setattr(runners.device, "available_cores", lambda: 1)
