"""The median pruner waits for real trainings, not for answered duplicates; ``auto`` never prunes a walk."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from nas.study.config import SearchConfig
from nas.study.session import MEDIAN_STARTUP_TRIALS, first_pruning_point, make_pruner, resolved_pruner
from runners.config import TrainConfig
from runners.presets import get_preset

STEP = first_pruning_point(TrainConfig())


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(pruner=make_pruner(SearchConfig(pruner="median"), TrainConfig()))


def _trained(study: optuna.Study, loss: float) -> None:
    """A trial that trained: an intermediate value at STEP, then complete."""
    trial = study.ask()
    trial.report(loss, STEP)
    study.tell(trial, loss)


def _duplicate(study: optuna.Study, loss: float) -> None:
    """How ``nas.study`` answers a duplicate of a completed trial: COMPLETE, no intermediate values."""
    study.tell(study.ask(), loss)


def _would_prune(study: optuna.Study, loss: float, step: int = STEP) -> bool:
    trial = study.ask()
    trial.report(loss, step)
    pruned = trial.should_prune()
    study.tell(trial, state=TrialState.PRUNED if pruned else TrialState.FAIL)
    return pruned


def test_duplicates_do_not_count_towards_the_median_pruners_start_up() -> None:
    study = _study()
    _trained(study, 2.0)
    for _ in range(2 * MEDIAN_STARTUP_TRIALS):
        _duplicate(study, 2.0)
    # one real training and many duplicates: a much worse trial is still not pruned
    assert not _would_prune(study, 9.0)
    for _ in range(MEDIAN_STARTUP_TRIALS - 1):
        _trained(study, 2.0)
    # now MEDIAN_STARTUP_TRIALS trainings reported at this step: the same trial is pruned
    assert _would_prune(study, 9.0)
    assert not _would_prune(study, 1.5)


def test_auto_trains_every_member_of_an_exhaustive_walk_to_the_end_and_prunes_sampled_trials() -> None:
    auto = SearchConfig()
    assert auto.pruner == "auto"
    assert resolved_pruner(auto, exhaustive=True) == "none"
    assert isinstance(make_pruner(auto, TrainConfig(), exhaustive=True), optuna.pruners.NopPruner)
    assert isinstance(make_pruner(auto, TrainConfig(), exhaustive=False), optuna.pruners.MedianPruner)
    # asked for by name, a pruner prunes a walk too
    assert isinstance(make_pruner(SearchConfig(pruner="median"), TrainConfig(), exhaustive=True),
                      optuna.pruners.MedianPruner)


def test_the_median_pruner_waits_for_half_the_trial_where_early_losses_rank_runs() -> None:
    cpu = get_preset("cpu").train
    # the default proxy evaluates every 8k of its 32k tokens: 8k ranks runs at Spearman 0.29, 16k at 0.74
    assert first_pruning_point(cpu) == 16_384
    assert first_pruning_point(cpu.with_(eval_every=4_096)) == 16_384
    assert first_pruning_point(cpu.with_(eval_every=12_288)) == 24_576
    # a trial with one evaluation before its end can still be pruned there
    assert first_pruning_point(cpu.with_(eval_every=16_384)) == 16_384
    assert first_pruning_point(cpu.with_(eval_every=32_768)) == 32_768
    study = _study()
    for _ in range(MEDIAN_STARTUP_TRIALS):
        trial = study.ask()
        for step in range(STEP // 2, STEP + 1, STEP // 2):
            trial.report(2.0, step)
        study.tell(trial, 2.0)
    assert not _would_prune(study, 9.0, step=STEP // 2)  # before the first pruning point: never
    assert _would_prune(study, 9.0, step=STEP)
