"""A re-run's identity (issue 32, item 2): a run is reused or counted as recorded only when everything that changes
its result is the same (the proxy study and its identity, the target's training setup with ``--tokens``, the data's
fingerprint), and no study name writes outside ``--runs``. Fast: the plan and the records, no training (the slow
end-to-end re-run is ``tests/test_rerun.py``)."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from nas.rerun.plan import PlannedRun, PlannedShape, RerunSettings, plan_runs, safe_name
from nas.rerun.record import record, recorded, rerun_study
from runners.presets import get_preset
from search_spaces.transfer import transfer_shape


def settings(**changes) -> RerunSettings:
    preset = get_preset("tiny")
    base = RerunSettings("proxy", {"space": "prism", "preset": "tiny"}, "tiny",
                         {**preset.train.result_fields(), "seed": None}, "0123456789abcdef")
    return dataclasses.replace(base, **changes)


def baseline_shape() -> PlannedShape:
    baseline = get_preset("tiny").baseline
    return PlannedShape("base", 1, "baseline", transfer_shape(baseline, {"space": "prism"}, baseline, baseline))


def other_train(field: str, scale: float) -> RerunSettings:
    base = settings()
    return dataclasses.replace(base, train={**base.train, field: base.train[field] * scale})


@pytest.mark.parametrize("changed", [
    pytest.param(lambda: other_train("tokens", 2), id="tokens"),
    pytest.param(lambda: other_train("lr", 0.5), id="a-training-option"),
    pytest.param(lambda: settings(data_fingerprint="fedcba9876543210"), id="other-data"),
    pytest.param(lambda: settings(proxy_identity={"space": "prism", "preset": "tiny", "heads": "12"}),
                 id="another-storages-study-of-the-same-name"),
])
def test_a_rerun_with_other_settings_gets_other_folders_and_counts_none_of_the_first_ones_runs(tmp_path, changed):
    first, second = settings(), changed()
    assert first.digest != second.digest
    shapes = [baseline_shape()]
    folders_first = {run.folder for run in plan_runs(shapes, 2, tmp_path, first)}
    folders_second = {run.folder for run in plan_runs(shapes, 2, tmp_path, second)}
    assert folders_first.isdisjoint(folders_second)

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'nas.db'}")
    study = rerun_study(storage, first, "first", {})
    run = plan_runs(shapes, 1, tmp_path, first)[0]
    record(study, run, {"status": "ok", "val_loss": 2.5}, [0], first)
    assert recorded(study, first) == {("base", 0)}
    assert recorded(study, second) == set()  # the first settings' run is not "recorded already" for the second
    again = rerun_study(storage, second, "second", {})
    assert again.study_name != study.study_name and again.study_name.endswith(second.digest)
    assert rerun_study(storage, first, "first", {}).study_name == study.study_name  # the same settings: the same


def test_the_same_settings_are_the_same_run():
    assert settings().digest == settings().digest


@pytest.mark.parametrize("name", ["..", "../..", "/etc", "a/../../b", ".hidden", "", "x" * 300, "\udcff", "ün i/ç"])
def test_no_study_name_writes_outside_the_runs_folder(tmp_path, name):
    runs = tmp_path / "runs"
    for run in plan_runs([baseline_shape()], 1, runs, settings(proxy_study=name, preset=name or "tiny")):
        assert isinstance(run, PlannedRun)
        assert run.folder.resolve().is_relative_to(runs.resolve()), run.folder
        assert len(run.folder.relative_to(runs).parts) == 4  # study / preset-settings / shape / seed
    assert not safe_name(name).startswith(".")
    assert safe_name("a/b") != safe_name("a_b")
