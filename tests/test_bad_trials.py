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

