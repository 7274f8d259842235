"""Bad trials inside a search: a diverging shape, an out-of-memory shape, a NaN in the data path.

Each is recorded with its status and reason, counts as a trained trial (it is a result about
that shape), and the study goes on to the requested number of trials. (A NaN in a token file
cannot reach training: float token arrays are refused by name, ``test_corrupt_data.py``.) The faults are injected
into the real training code of one shape only; everything else trains for real.
"""

from __future__ import annotations

import pytest
import torch
from optuna.trial import TrialState
from search_helpers import assert_no_repeated_work, load_trials, sqlite_url

import runners.proxy
from nas.study.config import SearchConfig
from nas.study.parallel import run_search
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SPACE5 = SpaceOptions(space="prism", layers=6)  # the tiny preset's baseline at six layers: 5 members
MEMBERS = list(build_space(SPACE5, defaults=get_preset("tiny").baseline))


def test_an_out_of_memory_shape_and_a_nan_in_its_batches_are_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    oom_key, nan_key = MEMBERS[1].key(), MEMBERS[2].key()
    training = runners.proxy._train

    def train_or_fail(model, cfg, data, val, device, report, result):
        key = model.arch.key()
        if key == oom_key:  # as the allocator says it on a GPU
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if key == nan_key:  # a NaN enters the data path: the embedding of every batch of this shape
            model.embed.register_forward_hook(lambda module, args, output: output * float("nan"))
        return training(model, cfg, data, val, device, report, result)

    monkeypatch.setattr(runners.proxy, "_train", train_or_fail)
    storage = sqlite_url(tmp_path / "bad.db")
    search = run_search(SearchConfig(space=SPACE5, preset="tiny", storage=storage, trials=5, pruner="none"))
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, 5)
    by_key = {t.user_attrs["key"]: t for t in trials if "status" in t.user_attrs}
    oom, nan = by_key[oom_key], by_key[nan_key]
    assert oom.user_attrs["status"] == "oom" and "out of memory" in oom.user_attrs["reason"]
    assert nan.user_attrs["status"] == "diverged" and "nan" in nan.user_attrs["reason"].lower()
    assert oom.state == nan.state == TrialState.FAIL
    others = [t for k, t in by_key.items() if k not in (oom_key, nan_key)]
    assert len(others) == 3 and all(t.state == TrialState.COMPLETE for t in others)


def test_an_absurd_learning_rate_diverges_every_trial_with_its_reason_and_the_study_still_finishes(tmp_path):
    storage = sqlite_url(tmp_path / "lr.db")
    search = run_search(SearchConfig(space=SPACE5, preset="tiny", storage=storage, trials=3,
                                     train_overrides=(("lr", 1e4), ("warmup_frac", 0.0), ("grad_clip", 1e9))))
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, 3)
    assert all(t.user_attrs["status"] == "diverged" and "loss" in t.user_attrs["reason"]
               for t in trials if "status" in t.user_attrs)



def test_a_batch_that_does_not_fit_is_halved_into_accumulated_micro_batches_not_failed(tmp_path, monkeypatch):
    # the allocator fails any forward of more than one sequence for one shape (as a GPU would for a too-large
    # micro-batch): its trial retries with 2, then 1 sequence per forward and completes; the rest is untouched
    big_key = MEMBERS[1].key()
    training = runners.proxy._train

    def train_in_small_pieces(model, cfg, data, val, device, report, result):
        if model.arch.key() == big_key:
            forward = model.forward

            def limited(x, *args, **kwargs):
                if model.training and x.shape[0] > 1:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                return forward(x, *args, **kwargs)

            model.forward = limited
        return training(model, cfg, data, val, device, report, result)

    monkeypatch.setattr(runners.proxy, "_train", train_in_small_pieces)
    storage = sqlite_url(tmp_path / "halved.db")
    search = run_search(SearchConfig(space=SPACE5, preset="tiny", storage=storage, trials=5, pruner="none"))
    trials = load_trials(storage, search.config.study_name)
    assert_no_repeated_work(trials, 5)
    by_key = {t.user_attrs["key"]: t for t in trials if "status" in t.user_attrs}
    halved, whole = by_key[big_key], by_key[MEMBERS[0].key()]
    assert halved.state == TrialState.COMPLETE and halved.user_attrs["micro_batch"] == 1, halved.user_attrs
    assert "micro-batch halved to 1 of 4" in halved.user_attrs["reason"]
    assert whole.user_attrs["micro_batch"] == 4 and whole.user_attrs["reason"] is None


def test_accumulated_micro_batches_train_as_the_whole_batch_does():
    from nas.data.loading import load_data

    preset = get_preset("tiny")
    data = load_data("builtin")
    whole = runners.proxy.run(preset.baseline, preset.train.with_(tokens=1_024, threads=1), data)
    pieces = runners.proxy.run(preset.baseline, preset.train.with_(tokens=1_024, threads=1, micro_batch=1), data)
    assert pieces.micro_batch == 1 and pieces.val_loss == pytest.approx(whole.val_loss, abs=1e-4)
