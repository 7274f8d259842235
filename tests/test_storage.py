"""``nas.study.storage``: one-transaction attribute writes (same values as Optuna's API), trials that never beat."""

from __future__ import annotations

import math
import time

import optuna
import pytest
from optuna.trial import TrialState

from nas.study.optuna_internals import unbeaten_trial_ids
from nas.study.storage import make_storage, write_user_attrs

ATTRS = {"key": "h=4x4", "seed": 3, "curve": [[1, 2.5], [2, None]], "arch": {"heads": [1, 2], "k": 4},
         "val_loss": 2.75, "reason": None, "unicode": "Δ h_l ≤ h_{l+1}"}


def _check_batched_write(url: str) -> None:
    storage = make_storage(url)
    study = optuna.create_study(storage=storage, study_name="attrs")
    trial = study.ask()
    write_user_attrs(storage, trial, ATTRS)
    assert study.get_trials()[0].user_attrs == ATTRS  # what the storage holds now
    write_user_attrs(storage, trial, {"seed": 4, "extra": 1.5})  # overwrites one, adds one
    study.tell(trial, 1.0)
    reference = study.ask()
    for key, value in {**ATTRS, "seed": 4, "extra": 1.5}.items():
        reference.set_user_attr(key, value)
    study.tell(reference, 1.0)
    # a fresh process's view: read back through a new storage object
    stored = optuna.load_study(study_name="attrs", storage=make_storage(url)).get_trials()
    assert stored[0].user_attrs == stored[1].user_attrs == {**ATTRS, "seed": 4, "extra": 1.5}
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # a finished trial stays as told
        write_user_attrs(storage, trial, {"late": True})
    assert "late" not in optuna.load_study(study_name="attrs", storage=make_storage(url)).trials[0].user_attrs


def test_batched_attributes_read_back_as_optunas_own_on_sqlite(tmp_path):
    _check_batched_write(f"sqlite:///{tmp_path / 'attrs.db'}")


@pytest.mark.slow
def test_batched_attributes_read_back_as_optunas_own_on_postgresql(postgres_url):
    _check_batched_write(postgres_url)


def test_other_storages_take_optunas_per_key_api():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    write_user_attrs(storage, trial, {"a": 1, "b": [math.pi]})
    study.tell(trial, 0.0)
    assert study.trials[0].user_attrs == {"a": 1, "b": [math.pi]}
    assert study.trials[0].state == TrialState.COMPLETE


def _check_unbeaten(url: str) -> None:
    storage = make_storage(url, heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="beats")
    study_id = storage.get_study_id_from_name("beats")
    silent, beating, done = study.ask(), study.ask(), study.ask()
    storage.record_heartbeat(beating._trial_id)
    study.tell(done, 1.0)
    assert unbeaten_trial_ids(storage, study_id, older_than_s=60) == []  # too young to call abandoned
    time.sleep(1.2)
    # not the beating one, not the finished one
    assert unbeaten_trial_ids(storage, study_id, older_than_s=1) == [silent._trial_id]


def test_trials_that_never_beat_are_found_once_old_enough_on_sqlite(tmp_path):
    _check_unbeaten(f"sqlite:///{tmp_path / 'beats.db'}")


@pytest.mark.slow
def test_trials_that_never_beat_are_found_once_old_enough_on_postgresql(postgres_url):
    _check_unbeaten(postgres_url)
