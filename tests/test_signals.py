"""Ctrl-C at the worst moment: a signal that lands inside a storage write leaves no trial RUNNING."""

from __future__ import annotations

import os
import signal

import optuna
import pytest
from optuna.trial import TrialState
from search_helpers import sqlite_url

from nas.study.config import SearchConfig
from nas.study.parallel import run_search
from nas.study.signals import interruptible, interrupts_deferred
from search_spaces.factory import SpaceOptions


def test_a_signal_inside_the_deferred_block_is_delivered_when_it_ends():
    interruptible()
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # a second one is not delivered twice
        reached_the_end = True
    assert reached_the_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


@pytest.mark.parametrize("asks_before", [0, 2])  # the queued baseline, or a planned member after two trials
def test_a_signal_right_after_ask_committed_its_trial_leaves_it_interrupted_and_requeued(tmp_path, one_thread,
                                                                                        monkeypatch, asks_before):
    interruptible()
    storage = sqlite_url(tmp_path / "ask.db")
    ask, calls = optuna.Study.ask, [0]

    def ask_then_ctrl_c(self, *args, **kwargs):
        trial = ask(self, *args, **kwargs)  # the storage holds the RUNNING trial now
        calls[0] += 1
        if calls[0] == asks_before + 1:
            signal.raise_signal(signal.SIGINT)  # before the caller has the trial in hand
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask_then_ctrl_c)
    config = SearchConfig(space=SpaceOptions(space="prism"), preset="tiny", storage=storage, study_name="ask",
                          trials=3, train_overrides=(("tokens", 1_000),))
    with pytest.raises(KeyboardInterrupt):
        run_search(config)
    trials = optuna.load_study(study_name="ask", storage=storage).get_trials(deepcopy=False)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING], "a trial was left RUNNING"
    (interrupted,) = [t for t in trials if t.user_attrs.get("status") == "interrupted"]
    assert interrupted.number == asks_before
    if "key" in interrupted.user_attrs:  # it had its shape (the queued baseline does): the same shape is queued again
        (retry,) = [t for t in trials if t.state == TrialState.WAITING]
        assert retry.user_attrs["key"] == interrupted.user_attrs["key"]
