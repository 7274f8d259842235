"""The joint space: hourglass FFN shapes at a budget, each with every valid Prism schedule."""

from __future__ import annotations

import warnings

import optuna
import pytest

from nas.errors import UsageError
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.prism import PrismSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def joint() -> JointSpace:
    hourglass = HourglassSpace(8, 192, 12, k_values=(1, 2, 4), layer_values=(6, 8, 10),
                               ratio_values=(0.3, 0.5, 1.0), tolerance=0.005)
    return JointSpace(hourglass)


def test_count_equals_enumeration_and_sums_the_prism_counts(joint):
    members = list(joint)
    assert len(members) == joint.count() == len({m.key() for m in members})
    expected = sum(PrismSpace(a.n_layers, a.d_model, a.heads[0], ffn=a.ffn).count() for a in joint.hourglass)
    assert joint.count() == expected
    assert members[0] == joint.baseline() == joint.hourglass.baseline()
    assert joint.hourglass.count() >= 5


def test_every_member_is_valid_and_keeps_its_budget_match(joint):
    for arch in joint:
        assert joint.validate(arch) == []
        budget = joint.hourglass.budget
        assert abs(arch.n_params()["total"] - budget) <= joint.hourglass.tolerance * budget
    rows = [joint.row(a) for a in joint]
    assert {"heads", "plateaus", "k", "d_h", "params", "budget_deviation"} <= set(rows[0])
    assert rows[0]["kind"] == "baseline" and any(r["kind"] == "hourglass+prism" for r in rows)


def test_params_of_inverts_suggest_for_every_member(joint):
    for arch in joint:
        assert joint.suggest(optuna.trial.FixedTrial(joint.params_of(arch))) == arch


def test_tpe_suggests_only_members_with_stable_distributions(joint):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(multivariate=True, group=True, seed=0)
    study = optuna.create_study(sampler=sampler)
    suggested = []

    def objective(trial):
        arch = joint.suggest(trial)
        suggested.append(arch)
        return sum(arch.heads) / arch.d_model + arch.ffn.k

    study.optimize(objective, n_trials=200)
    assert all(joint.contains(a) for a in suggested)
    distributions: dict[str, object] = {}
    for trial in study.trials:
        for name, dist in trial.distributions.items():
            assert distributions.setdefault(name, dist) == dist, f"{name} changed its range"
    assert {"ffn_draw", "k", "layers", "d_h_over_d_model", "n_plateaus_draw"} <= set(distributions)


def test_validate_explains_the_shape_and_the_schedule(joint):
    base = joint.baseline()
    bad_schedule = base.replace(heads=[12] * (base.n_layers - 1) + [6])
    assert "the last layer has 6 heads; schedules must end at h_base=12" in joint.validate(bad_schedule)
    bad_shape = base.replace(ffn={"k": 3, "hidden": 100})
    assert all(r.startswith("FFN shape: ") for r in joint.validate(bad_shape)) and joint.validate(bad_shape)


def test_prism_options_apply_to_every_width():
    hourglass = HourglassSpace(8, 192, 12, k_values=(2,), layer_values=(6, 8), ratio_values=(0.5,), tolerance=0.01)
    aligned = JointSpace(hourglass, hw_aligned=True)
    assert all(aligned.prism_of(a).hw_aligned for a in hourglass)
    assert aligned.count() < JointSpace(hourglass).count()
    with pytest.raises(UsageError, match="min_baseline=7 is invalid for layers=6"):
        JointSpace(hourglass, min_baseline=7)
