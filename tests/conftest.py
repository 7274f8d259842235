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
