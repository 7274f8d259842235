"""The studies a storage holds, read: what each is (a shape search, re-runs, another tool's), how many trials each
holds and trained, and the one shape search a read command opens (read-only, by name or as the only one)."""

from __future__ import annotations

from typing import Any

import optuna

from nas.errors import UsageError, printable
from nas.study.config import check_study_name, display_url
from nas.study.storage import make_storage


def study_kind(user_attrs: dict[str, Any]) -> str:
    """What a stored study is, from the user attrs its maker set: ``shape search`` (``nas search``: its
    ``nas:identity`` and ``nas:baseline_key``), ``re-runs of <study>`` (``nas rerun``), or ``not a shape search``
    (any other Optuna study sharing the storage: a learning-rate sweep, another tool's)."""
    if user_attrs.get("nas:rerun_of"):
        return f"re-runs of {user_attrs['nas:rerun_of']}"
    identity = user_attrs.get("nas:identity")
    if isinstance(identity, dict) and isinstance(identity.get("space"), dict) \
            and isinstance(user_attrs.get("nas:baseline_key"), str):
        return SHAPE_SEARCH
    return NOT_A_SHAPE_SEARCH


SHAPE_SEARCH, NOT_A_SHAPE_SEARCH = "shape search", "not a shape search"


def list_studies(storage: optuna.storages.BaseStorage) -> list[tuple[str, str, int, int | None]]:
    """(name, ``study_kind``, trials stored, trials trained) of every study in ``storage``, in the order it holds
    them. Trained is what ``--trials`` counts (``nas.study.records.counts``: no duplicate, nothing re-queued, no
    crash), for shape searches; None for the others, whose trials mean what their own tool says."""
    from nas.study.records import counts

    listed = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        kind = study_kind(summary.user_attrs)
        trained = None
        if kind == SHAPE_SEARCH:
            study_id = storage.get_study_id_from_name(summary.study_name)
            trained = sum(1 for t in storage.get_all_trials(study_id, deepcopy=False) if counts(t))
        listed.append((summary.study_name, kind, summary.n_trials, trained))
    return listed


def load_existing_study(url: str, study_name: str | None) -> optuna.Study:
    """An existing study, read-only (``open_existing_study``)."""
    return open_existing_study(url, study_name)[0]


def open_existing_study(url: str, study_name: str | None) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """An existing shape search and its storage, opened read-only: ``study_name``, or the storage's only one.

    ``UsageError`` naming the studies the storage holds (and which of them are shape searches) when
    ``study_name`` is missing from it, is a study that ``nas search`` did not make, or is None while the
    storage holds no shape search or several.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if study_name is not None:
        check_study_name(study_name)
    storage = make_storage(url, read_only=True)
    studies = {s.study_name: study_kind(s.user_attrs) for s in storage.get_all_studies()}  # no trial is read
    searches = [name for name, kind in studies.items() if kind == SHAPE_SEARCH]
    listing = ", ".join(f"{printable(name)} ({kind})" for name, kind in studies.items()) or "none"
    if study_name is None:
        if not searches:  # no --study-name can help: nothing there was made by `nas search`
            raise UsageError(f"{display_url(url)} holds no shape search (`nas search --storage ...` makes one); "
                             f"its studies: {listing}")
        if len(searches) > 1:
            raise UsageError(f"give --study-name: {display_url(url)} holds {len(searches)} shape searches; "
                             f"its studies: {listing}")
        study_name = searches[0]
    if study_name not in studies:
        raise UsageError(f"no study {study_name!r} in {display_url(url)}; its studies: {listing}")
    if studies[study_name] != SHAPE_SEARCH:
        raise UsageError(f"study {study_name!r} in {display_url(url)} is {studies[study_name]}: `nas search` did "
                         f"not make it, so it has no shapes to rank; shape searches there: "
                         f"{', '.join(map(printable, searches)) or 'none'} (nas studies lists them all)")
    return optuna.load_study(study_name=study_name, storage=storage), storage
