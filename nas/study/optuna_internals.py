"""The one module that reaches into Optuna's private API; everything else in prism-nas uses public API only.

Each use below has no public equivalent at the same cost (``tests/test_layering.py`` keeps
private Optuna names out of every other module; ``pyproject.toml`` pins the Optuna major
version these were written against, 5.x, which CI installs):

- ``trial_id``: ``Trial._trial_id``, the storage key of a running trial. The public route,
  ``storage.get_trial_id_from_study_id_trial_number``, costs a query per trial.
- ``write_user_attrs``: one multi-row upsert into Optuna's own ``trial_user_attributes``
  table. ``Trial.set_user_attr`` commits one attribute per transaction (~38 commits for a
  trained trial: ~0.2 s on SQLite, 2 % of a default CPU trial; ``benchmarks`` figure 5).
- ``drop_connections``: ``Study._storage``'s thread-local SQLAlchemy session closed and its engine's pooled
  connections discarded, so that a storage call a signal cut short (``KeyboardInterrupt`` inside it) leaves
  nothing behind while the worker marks its trial interrupted: neither an open transaction holding SQLite's
  write lock nor a pending statement (a query executed, its rows never read) whose WAL snapshot outlives the
  rollback, on which every later ``BEGIN IMMEDIATE`` answers "database is locked" at once once another worker
  has committed. No public API reaches the session or the engine.
- ``stale_trial_ids``: ``RDBStorage._get_stale_trial_ids``, the trials ``fail_stale_trials`` would fail: the public
  function fails them without a word, where each failed trial here records why (``nas.study.recovery.fail_stale``).
- ``schema_revisions``: the table-schema revisions this Optuna knows (its alembic scripts, which
  ``RDBStorage`` reads through its private ``_VersionManager``): a storage made by another Optuna is
  refused before anything opens it for writing (switching a file to WAL already changes its header).
- ``unbeaten_trial_ids``: RUNNING trials that never recorded a heartbeat. Optuna's public
  stale check (``fail_stale_trials``) skips trials without a heartbeat row, and no public API
  reads heartbeats.
- ``vectorise_tpe_log_ndtr``: for simulated studies only (``benchmarks/rule_simulation.py``), TPE's normal log cdf
  (``samplers._tpe._truncnorm._log_ndtr``, evaluated element by element in Python) replaced by scipy's vectorised
  ``log_ndtr``: the same values within 4e-13 over [-40, 40], so the sampler proposes exactly what it would, some
  ten times faster. A search never calls it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState


def schema_revisions() -> tuple[str, frozenset[str]]:
    """(the newest revision, every revision) of the table schema this Optuna reads and writes."""
    import os

    from alembic.config import Config
    from alembic.script import ScriptDirectory

    folder = os.path.join(os.path.dirname(optuna.storages._rdb.storage.__file__), "alembic")
    config = Config()
    config.set_main_option("script_location", folder)
    script = ScriptDirectory.from_config(config)
    return script.get_current_head() or "", frozenset(r.revision for r in script.walk_revisions())


def table_names() -> frozenset[str]:
    """Every table an Optuna storage of this version holds: its models' (``optuna.storages._rdb.models``) and
    Alembic's ``alembic_version``."""
    from optuna.storages._rdb import models

    return frozenset(models.BaseModel.metadata.tables) | {"alembic_version"}


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The storage's id of a trial handed out by ``study.ask()``, or read from the study."""
    return trial._trial_id


def _rdb(storage: optuna.storages.BaseStorage) -> optuna.storages.RDBStorage | None:
    """The ``RDBStorage`` behind ``storage`` (Optuna wraps one in a cache), or None for other storages."""
    backend = getattr(storage, "_backend", storage)
    return backend if isinstance(backend, optuna.storages.RDBStorage) else None


def drop_connections(study: optuna.Study) -> None:
    """Close the calling thread's storage session (rolling back whatever it left open) and close the engine's pooled
    connections (finalizing any statement left pending on them; module docstring): the next storage call opens a
    fresh connection. Connections other threads hold are left to them. A no-op off an RDB."""
    rdb = _rdb(study._storage)
    if rdb is not None:
        rdb.scoped_session.remove()
        rdb.engine.dispose()


def write_user_attrs(storage: optuna.storages.BaseStorage, trial_id: int, attrs: dict[str, Any]) -> bool:
    """Upsert every key of ``attrs`` on the running trial ``trial_id`` in one transaction.

    The statement is the one Optuna issues per key (same table, same JSON encoding), after the
    same "is the trial still running" check (``UpdateFinishedTrialError`` otherwise). Returns
    False, writing nothing, for storages other than SQLite or PostgreSQL behind an ``RDBStorage``:
    the caller then takes Optuna's per-key API.
    """
    backend = _rdb(storage)
    dialect = backend.engine.name if backend is not None else None
    if dialect not in ("sqlite", "postgresql"):
        return False
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        from sqlalchemy.dialects.postgresql import insert
    table = models.TrialUserAttributeModel
    rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in attrs.items()]
    statement = insert(table).values(rows)
    statement = statement.on_conflict_do_update(index_elements=[table.trial_id, table.key],
                                                set_={"value_json": statement.excluded.value_json})
    with _create_scoped_session(backend.scoped_session) as session:
        state = models.TrialModel.find_or_raise_by_id(trial_id, session).state
        backend.check_trial_is_updatable(trial_id, state)
        session.execute(statement)
    return True


def stale_trial_ids(storage: optuna.storages.BaseStorage, study_id: int) -> list[int]:
    """RUNNING trials whose heartbeat is older than the storage's grace period: what
    ``optuna.storages.fail_stale_trials`` fails, read through ``RDBStorage._get_stale_trial_ids`` so that each one
    can carry its status and reason before it is failed (the public function fails them with neither). ``[]`` where
    the storage keeps no heartbeats."""
    backend = _rdb(storage)
    if backend is None or backend.get_heartbeat_interval() is None:
        return []
    return list(backend._get_stale_trial_ids(study_id))


def unbeaten_trial_ids(storage: optuna.storages.BaseStorage, study_id: int, older_than_s: float) -> list[int]:
    """Trials RUNNING for more than ``older_than_s`` seconds that never recorded a heartbeat.

    A live trial beats within milliseconds of ``ask()``, so one that is this old without a beat
    was abandoned (its worker died in between). Start times are the asking worker's clock
    (Optuna's own convention), so ``older_than_s`` should exceed any clock skew between machines.
    Non-RDB storages: ``[]``.
    """
    backend = _rdb(storage)
    if backend is None:
        return []
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    started = models.TrialModel._datetime_start_utc  # Optuna 5 stores naive UTC
    cutoff = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=older_than_s)
    beaten = sqlalchemy.select(models.TrialHeartbeatModel.trial_id)
    query = (sqlalchemy.select(models.TrialModel.trial_id)
             .where(models.TrialModel.study_id == study_id)
             .where(models.TrialModel.state == TrialState.RUNNING)
             .where(started < cutoff)
             .where(models.TrialModel.trial_id.not_in(beaten)))
    with _create_scoped_session(backend.scoped_session) as session:
        return list(session.execute(query).scalars())


def vectorise_tpe_log_ndtr() -> None:
    """TPE's normal log cdf evaluated by scipy's vectorised ``log_ndtr`` (module docstring): simulations only."""
    from optuna.samplers._tpe import _truncnorm
    from scipy.special import log_ndtr

    _truncnorm._log_ndtr = log_ndtr
