"""The Hourglass space: budget-matched grids over K, L and d_h/d_model, the conventional baseline first."""

from __future__ import annotations

import warnings

import optuna
import pytest

from nas.arch import FFNShape, llama_ffn_hidden
from nas.errors import UsageError
from search_spaces.hourglass import HourglassSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def proxy() -> HourglassSpace:
    """The CPU proxy's baseline (L=12, d=192, 12 heads, bytes) and its own budget."""
    return HourglassSpace(12, 192, 12)


@pytest.fixture(scope="module")
def gpt2_113m() -> HourglassSpace:
    return HourglassSpace(12, 768, 12, vocab_size=50304, budget=113_000_000, head_dim=16)


def _built_params(arch) -> int:
    torch = pytest.importorskip("torch")
    model_module = pytest.importorskip("nas.model")
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = model_module.Transformer(arch)
    return sum(p.numel() for p in model.parameters())


def test_the_conventional_baseline_comes_first(proxy):
    members = list(proxy)
    assert members[0] == proxy.baseline()
    assert proxy.baseline().ffn == FFNShape(1, llama_ffn_hidden(192)) and proxy.baseline().heads == (12,) * 12
    assert proxy.row(members[0])["kind"] == "baseline" and proxy.row(members[0])["budget_deviation"] == 0
    assert proxy.count() == len(members) == len({m.key() for m in members})


@pytest.mark.parametrize("space_name", ["proxy", "gpt2_113m"])
def test_every_member_is_within_tolerance_of_the_budget(space_name, request):
    space: HourglassSpace = request.getfixturevalue(space_name)
    assert space.count() > 20
    for arch in space:
        row = space.row(arch)
        assert abs(arch.n_params()["total"] - space.budget) <= space.tolerance * space.budget
        assert row["params"] == arch.n_params()["total"]
        assert row["budget_deviation"] == pytest.approx((row["params"] - space.budget) / space.budget)
        parts = ("params_embedding", "params_attention", "params_ffn", "params_norm")
        assert sum(row[part] for part in parts) == row["params"]
        assert row["d_model_per_layer"] == arch.d_model / arch.n_layers
        assert row["d_h_over_d_model"] == arch.ffn.hidden / arch.d_model
        assert arch.d_model % space.head_dim == 0 and set(arch.heads) == {arch.d_model // space.head_dim}
        assert space.validate(arch) == []


@pytest.mark.parametrize("space_name", ["proxy", "gpt2_113m"])
def test_reported_params_equal_the_built_model(space_name, request):
    space: HourglassSpace = request.getfixturevalue(space_name)
    members = list(space)
    for arch in members[:: max(1, len(members) // 6)]:
        assert space.row(arch)["params"] == _built_params(arch)


@pytest.mark.parametrize("head_dim", [16, 64])
def test_113m_budget_has_k4_members_near_ratio_0_4(head_dim):
    space = HourglassSpace(12, 768, 12, vocab_size=50304, budget=113_000_000, head_dim=head_dim)
    near = [a for a in space if a.ffn.k == 4 and abs(a.ffn.hidden / a.d_model - 0.4) <= 0.06]
    assert near, "the paper's best shape (K=4, d_h/d_model ~ 0.4) is in the grid"
    base = space.baseline()
    assert base.ffn.k == 1 and 2.2 < base.ffn.hidden / base.d_model < 3.2 and abs(space.deviation(base)) <= 0.001


def test_a_budget_other_than_the_baselines_solves_the_conventional_shape_too():
    space = HourglassSpace(12, 192, 12, budget=8_000_000)
    base = space.baseline()
    assert base.n_layers == 12 and base.ffn.k == 1 and base.d_model != 192
    assert abs(space.deviation(base)) <= space.tolerance
    assert abs(base.ffn.hidden / base.d_model - 8 / 3) < 0.3


def test_fixed_attention_keeps_d_model_and_layers():
    space = HourglassSpace(12, 768, 12, vocab_size=50304, fix="attention")
    base = space.baseline()
    members = list(space)
    assert len(members) > 1
    assert all((a.d_model, a.n_layers) == (base.d_model, base.n_layers) for a in members)
    p = base.n_params()
    assert all(a.n_params()["attention"] == p["attention"] for a in members)
    assert [a.ffn.k for a in members] == sorted(a.ffn.k for a in members)


def test_unmatched_points_are_reported_with_a_reason():
    space = HourglassSpace(12, 192, 12, tolerance=1e-5)
    misses = space.unmatched()
    assert misses and all(m.reason for m in misses)
    assert any("too coarse" in m.reason and "raise --tolerance" in m.reason for m in misses)
    matched = space.count() - 1  # the baseline is not a grid point
    assert matched + len(misses) == len(list(space.grid()))
    assert "same shape as the baseline" in [m.reason for m in HourglassSpace(12, 192, 12, fix="attention").unmatched()]


@pytest.mark.parametrize("options", [{}, {"fix": "attention", "tolerance": 0.01},
                                     {"k_values": (2, 3), "tolerance": 0.005}])
def test_params_of_inverts_suggest_for_every_member(options):
    space = HourglassSpace(12, 192, 12, **options)
    for arch in space:
        assert space.suggest(optuna.trial.FixedTrial(space.params_of(arch))) == arch


def test_unmatched_grid_points_are_repaired_to_members(proxy):
    for point in proxy.grid():
        params = {"ffn_draw": 1, "k": point.k, "layers": point.layers, "d_h_over_d_model": point.ratio}
        assert proxy.contains(proxy.suggest(optuna.trial.FixedTrial(params)))


def test_tpe_suggests_only_members(proxy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(multivariate=True, group=True, seed=0)
    study = optuna.create_study(sampler=sampler)
    suggested = []

    def objective(trial):
        arch = proxy.suggest(trial)
        suggested.append(arch)
        return abs(arch.ffn.hidden / arch.d_model - 0.4) + arch.ffn.k / 10

    study.optimize(objective, n_trials=150)
    assert all(proxy.contains(a) for a in suggested)
    assert len(set(suggested)) > 5


def test_validate_explains_non_members(proxy):
    base = proxy.baseline()
    reasons = proxy.validate(base.replace(ffn={"k": 1, "hidden": 1024}))
    assert any("off the budget" in r for r in reasons)
    reasons = proxy.validate(base.replace(heads=[6] * 6 + [12] * 6))
    assert "hourglass members have d_model/head_dim = 12 heads in every layer" in reasons


def test_bad_options_raise_usage_errors():
    with pytest.raises(UsageError, match="head_dim=40 does not divide the baseline's d_model=192"):
        HourglassSpace(12, 192, 12, head_dim=40)
    with pytest.raises(UsageError, match="drop --layer-values"):
        HourglassSpace(12, 192, 12, fix="attention", layer_values=(6, 12))
    with pytest.raises(UsageError, match="unknown fix 'ffn'"):
        HourglassSpace(12, 192, 12, fix="ffn")
    with pytest.raises(UsageError, match="tolerance=0 is invalid"):
        HourglassSpace(12, 192, 12, tolerance=0)


def test_every_fixed_attention_point_matches_a_20m_budget_to_a_hundredth_of_a_percent():
    """Sub-MLPs of d_h and d_h + 1 (FFNShape.wider) step the budget by 3 d parameters: with d_h alone only
    K = 1, 2, 8 came within 0.1 % of 20M (steps of 3 L K d)."""
    space = HourglassSpace(12, 96, 12, budget=20_000_000, vocab_size=256, fix="attention", tolerance=0.0001)
    assert sorted(a.ffn.k for a in space) == [1, 2, 4, 6, 8] and not [u for u in space.unmatched()
                                                                      if "same shape" not in u.reason]
    for arch in space:
        assert abs(space.deviation(arch)) <= 0.0001 and 0 <= arch.ffn.wider < arch.n_layers * arch.ffn.k


def test_wider_sub_mlps_are_counted_exactly_in_the_built_model():
    torch = pytest.importorskip("torch")
    from nas.model import Transformer

    space = HourglassSpace(6, 64, 4, budget=400_000, vocab_size=256, tolerance=0.0005)
    wide = [a for a in space if a.ffn.wider]
    assert wide
    for arch in wide[:5]:
        with torch.device("meta"):
            model = Transformer(arch)
        assert arch.n_params()["total"] == sum(p.numel() for p in model.parameters())
        hidden = [ffn.down.in_features for block in model.blocks for ffn in block.ffns]
        assert hidden.count(arch.ffn.hidden + 1) == arch.ffn.wider and set(hidden) <= {arch.ffn.hidden,
                                                                                       arch.ffn.hidden + 1}


def test_gpu_aligned_widths_keep_d_h_a_multiple_of_64():
    space = HourglassSpace(12, 768, 12, vocab_size=50304, hidden_multiple=64, tolerance=0.03)
    members = [a for a in space if a.ffn.k > 1]
    assert members and all(a.ffn.hidden % 64 == 0 and a.ffn.wider == 0 for a in members)
    assert space.describe()["solver"] == "d_h multiple of 64" and HourglassSpace(12, 96, 12).describe()["solver"] \
        == "exact"
