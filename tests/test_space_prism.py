"""The Prism space: exact counting, streaming enumeration, validation and sampling of head schedules."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest

from nas.arch import ArchConfig, FFNShape
from nas.errors import UsageError
from search_spaces.prism import PrismSpace, format_plateaus, parse_schedule, plateaus

optuna.logging.set_verbosity(optuna.logging.WARNING)


def brute_force(layers, d_model, h_base, min_plateau=2, max_plateau=4, min_baseline=None, hw_aligned=False,
                min_head_dim=None):
    """Every non-decreasing sequence of divisors <= h_base, filtered by prism.py's rule, written afresh."""
    min_baseline = -(-layers // 2) if min_baseline is None else min_baseline
    divisors = [h for h in range(1, h_base + 1) if d_model % h == 0]
    valid = set()
    for seq in itertools.combinations_with_replacement(divisors, layers):
        runs = [(h, len(list(group))) for h, group in itertools.groupby(seq)]
        if runs[-1][0] != h_base or runs[-1][1] < min_baseline:
            continue
        ok = True
        for h, n in runs[:-1]:
            head_dim = d_model // h
            ok &= min_plateau <= n <= max_plateau
            ok &= not hw_aligned or head_dim & (head_dim - 1) == 0
            ok &= min_head_dim is None or head_dim >= min_head_dim
        if ok:
            valid.add(seq)
    return valid


SHAPES = [(1, 8, 4), (4, 12, 6), (6, 24, 8), (7, 30, 10), (8, 64, 16), (9, 96, 12), (10, 48, 12), (10, 36, 9)]
OPTIONS = [
    {},
    {"min_plateau": 1, "max_plateau": 3},
    {"min_plateau": 3, "max_plateau": 3},
    {"min_plateau": 1, "max_plateau": 10, "min_baseline": 1},
    {"min_baseline": "L"},
    {"hw_aligned": True},
    {"min_head_dim": 8},
    {"hw_aligned": True, "min_plateau": 1, "max_plateau": 2, "min_baseline": 1},
]


def _options(layers, options):
    return {k: (layers if v == "L" else v) for k, v in options.items()}


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}-d{}-h{}".format(*s))
def test_count_equals_enumeration_equals_brute_force(shape, options):
    options = _options(shape[0], options)
    space = PrismSpace(*shape, **options)
    listed = list(space.schedules())
    assert len(listed) == len(set(listed)), "every member exactly once"
    assert space.count() == len(listed)
    assert set(listed) == brute_force(*shape, **options)
    assert listed[0] == (shape[2],) * shape[0], "the uniform baseline comes first"
    assert list(space.schedules()) == listed, "deterministic order"


def test_gpt2_small_worked_example_has_129_schedules():
    space = PrismSpace(12, 768, 12)
    assert space.candidates == (1, 2, 3, 4, 6, 8)
    assert space.count() == 129 == sum(1 for _ in space)


def test_hw_aligned_worked_example_has_13_schedules():
    space = PrismSpace(12, 768, 12, hw_aligned=True)
    assert space.candidates == (3, 6)  # head dims 256 and 128
    assert space.count() == 13 == sum(1 for _ in space)


def test_every_member_is_valid_and_the_baseline_comes_first():
    space = PrismSpace(12, 768, 12)
    members = list(space)
    assert members[0] == space.baseline() == ArchConfig(12, 768, (12,) * 12, FFNShape(1, 2048), 256)
    assert all(space.validate(m) == [] for m in members)
    assert len({m.key() for m in members}) == len(members)


def test_iteration_streams():
    space = PrismSpace(128, 8192, 64, min_plateau=1, max_plateau=64)
    assert space.count() > 10**8  # too many to hold in memory: the first members must come at once
    first = list(itertools.islice(iter(space), 3))
    assert first[0] == space.baseline() and all(space.contains(a) for a in first)


def test_count_is_instant_for_128_layers(monkeypatch):
    def listing_refused(*args, **kwargs):
        raise AssertionError("listed the schedules to count them")

    # counted by the plateau-composition recurrence alone: listing 10^8 and more schedules would take hours
    monkeypatch.setattr(PrismSpace, "schedules", listing_refused)
    monkeypatch.setattr(PrismSpace, "_compositions", listing_refused)
    counts = [PrismSpace(128, 8192, 64).count(), PrismSpace(128, 8192, 64, min_plateau=1, max_plateau=64).count()]
    assert counts[0] > 0 and counts[1] > counts[0]


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ([8, 8, 8, 8, 6, 6, 12, 12, 12, 12, 12, 12], "layer 5: 6 heads after 8 — schedules must not decrease"),
        ([5, 5, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12], "layer 1: 5 heads does not divide d_model=768"),
        ([12] * 11 + [16], "layer 12: 16 heads exceeds the baseline's h_base=12"),
        ([6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6], "the last layer has 6 heads; schedules must end at h_base=12"),
        ([3, 3, 6, 6, 8, 8, 8, 12, 12, 12, 12, 12],
         "the baseline plateau (12 heads) has 5 layers; at least min_baseline=6 are required"),
        ([3, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12],
         "layer 1: the plateau of 3 heads has 1 layer; plateaus below the baseline need 2..4 layers"),
        ([3] * 5 + [12] * 7,
         "layers 1-5: the plateau of 3 heads has 5 layers; plateaus below the baseline need 2..4 layers"),
        ([12] * 11, "the schedule has 11 layers but the space has layers=12"),
    ],
)
def test_validate_names_each_broken_rule(schedule, expected):
    assert expected in PrismSpace(12, 768, 12).validate_schedule(schedule)


def test_validate_names_head_dim_options():
    schedule = [4, 4, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12]  # head dim 192
    assert PrismSpace(12, 768, 12, hw_aligned=True).validate_schedule(schedule) == [
        "layer 1: 4 heads gives head dim 192, not a power of two (hw_aligned)",
        "layer 2: 4 heads gives head dim 192, not a power of two (hw_aligned)",
    ]
    assert "layer 1: 4 heads gives head dim 192 < min_head_dim=256" in PrismSpace(
        12, 768, 12, min_head_dim=256).validate_schedule(schedule)


def test_validate_checks_the_fixed_parts_of_the_shape():
    space = PrismSpace(12, 768, 12)
    other = space.baseline().replace(vocab_size=50304)
    assert space.validate(other) == ["vocab_size=50304 but the space fixes vocab_size=256"]
    assert space.validate(space.baseline()) == [] and space.contains(space.baseline())


def test_bad_options_raise_one_line_usage_errors():
    with pytest.raises(UsageError, match="7 does not divide d_model=768; divisors ≤ 12 are 1,2,3,4,6,8,12"):
        PrismSpace(12, 768, 7)
    with pytest.raises(UsageError, match="min_plateau=5 > max_plateau=4"):
        PrismSpace(12, 768, 12, min_plateau=5)
    with pytest.raises(UsageError, match="min_baseline=13 is invalid for layers=12: choose 1..12"):
        PrismSpace(12, 768, 12, min_baseline=13)


def test_plateau_helpers_round_trip():
    heads = parse_schedule("3x2,6x2,12x8")
    assert heads == parse_schedule("3,3,6,6," + ",".join(["12"] * 8))
    assert plateaus(heads) == [(3, 2), (6, 2), (12, 8)] and format_plateaus(heads) == "3x2,6x2,12x8"
    with pytest.raises(UsageError, match="schedule item 'a' is not a count"):
        parse_schedule("3,a")
    # a repeat past the deepest shape is refused before the list is built (it was an OverflowError traceback, or
    # a MemoryError for 4x1000000000)
    for huge in ("4x99999999999999999999", "4x1000000000", "4x4000,4x97"):
        with pytest.raises(UsageError, match="gives more than 4,096 layers"):
            parse_schedule(huge)
    assert len(parse_schedule("4x4000,4x96")) == 4096


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_params_of_inverts_suggest_for_every_member(options):
    space = PrismSpace(10, 48, 12, **_options(10, options))
    for arch in space:
        assert space.suggest(optuna.trial.FixedTrial(space.params_of(arch))) == arch


def test_any_in_range_parameters_give_a_member():
    space = PrismSpace(12, 768, 12)
    rng = random.Random(0)
    for _ in range(2000):
        params = {"n_plateaus_draw": rng.randrange(space.draw_resolution())}
        for i in range(1, space.max_plateaus + 1):
            params[f"plateau_{i}_len"] = rng.randint(space.min_plateau, space.max_plateau)
            params[f"plateau_{i}_rank"] = rng.randrange(len(space.candidates))
        assert space.contains(space.suggest(optuna.trial.FixedTrial(params)))


def test_tpe_suggests_only_valid_members_with_stable_distributions():
    space = PrismSpace(12, 768, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(multivariate=True, group=True, seed=0)
    study = optuna.create_study(sampler=sampler)
    suggested: list[ArchConfig] = []

    def objective(trial: optuna.trial.Trial) -> float:
        arch = space.suggest(trial)
        suggested.append(arch)
        return sum(arch.heads)

    study.optimize(objective, n_trials=500)
    assert len(suggested) == 500 and all(space.validate(a) == [] for a in suggested)
    distributions: dict[str, object] = {}
    for trial in study.trials:
        for name, dist in trial.distributions.items():
            assert distributions.setdefault(name, dist) == dist, f"{name} changed its range"
    assert {"n_plateaus_draw", "plateau_1_len", "plateau_1_rank"} <= set(distributions)


def test_search_spaces_import_no_torch():
    code = ("import sys, search_spaces.factory, search_spaces.prism, search_spaces.hourglass, search_spaces.joint; "
            "assert 'torch' not in sys.modules, 'search_spaces must not import torch'")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_a_uniform_draw_proposes_the_baseline_as_one_member_among_all():
    """The plateau count is drawn in proportion to its members: the baseline (no plateau) is 1 of 129 draws, not
    1 of max_plateaus + 1 = 4 (a random sampler used to propose it in a quarter of its trials)."""
    space = PrismSpace(12, 96, 12)
    resolution = space.draw_resolution()
    counts = [0] * (space.max_plateaus + 1)
    for draw in range(resolution):
        counts[space.plateaus_of_draw(draw, resolution)] += 1
    assert [c / resolution for c in counts] == pytest.approx([m / space.count() for m in space.members_by_plateaus],
                                                             abs=1 / resolution)
    assert counts[0] / resolution == pytest.approx(1 / 129, abs=1e-3)
    for n in range(space.max_plateaus + 1):
        assert space.plateaus_of_draw(space.draw_of_plateaus(n, resolution), resolution) == n
