"""Grouped-query attention as a search axis (issue 38): the rule, the spaces, budget matching, options and bad input."""

from __future__ import annotations

import csv
import io
import itertools
import json
import warnings

import optuna
import pytest
from typer.testing import CliRunner

from nas.arch import MAX_LAYERS, uniform
from nas.cli import app
from nas.errors import UsageError
from search_spaces import kv_count
from search_spaces.factory import SpaceOptions, build_space
from search_spaces.grouped import KVScheduleSpace, UniformGroupPrismSpace
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.kv import KVRule
from search_spaces.kv_count import TABLE_CELLS, Caps, count_by_states, count_by_tables, count_over_prism
from search_spaces.prism import PrismSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)


def small(space: str, **kv) -> SpaceOptions:
    """A space small enough to list: 6 layers of width 48, 6 baseline heads (head dim 8)."""
    grid = {"k_values": (1, 2), "layer_values": (3, 6), "ratio_values": (0.5, 1.0), "tolerance": 0.003} \
        if space != "prism" else {}
    return SpaceOptions(space=space, layers=6, d_model=48, heads=6, **grid, **kv)


SMALL = [(space, kv) for space in ("prism", "hourglass", "joint")
         for kv in ({"kv_groups": (2, 3)}, {"kv_schedule": True}, {"kv_schedule": True, "kv_groups": (3,),
                                                                    "kv_max_plateau": 3, "min_kv_heads": 2})]
IDS = [f"{space}-{'schedule' if kv.get('kv_schedule') else 'uniform'}{'-options' if len(kv) > 2 else ''}"
       for space, kv in SMALL]


def test_spaces_without_gqa_options_keep_their_members_counts_and_identity():
    """No GQA option: the same classes, counts and descriptions (a study's identity, its default name) as before."""
    counts = {"prism": 129, "hourglass": 244, "joint": 29501}
    for name, count in counts.items():
        space = build_space(SpaceOptions(space=name))
        assert type(space) in (PrismSpace, HourglassSpace, JointSpace)
        assert space.count() == count
        assert not any("kv" in key for key in space.describe())
        assert not space.baseline().grouped


@pytest.mark.parametrize("space, kv", SMALL, ids=IDS)
def test_count_equals_enumeration_every_member_is_valid_budget_matched_and_suggest_inverts(space, kv):
    opts = small(space, **kv)
    gqa, plain = build_space(opts), build_space(small(space))
    members = list(gqa)
    assert len(members) == gqa.count() == len({m.key() for m in members})
    assert members[0] == gqa.baseline() == plain.baseline()
    assert {m.key() for m in plain} <= {m.key() for m in members}  # GQA adds members, never removes one
    grouped = [m for m in members if m.grouped]
    assert grouped
    budget = getattr(gqa, "budget", None) or getattr(getattr(gqa, "hourglass", None), "budget", None) or \
        gqa.baseline().n_params()["total"]
    for arch in members:
        assert gqa.validate(arch) == [], arch.label()
        assert abs(arch.n_params()["total"] - budget) <= 0.003 * budget
        assert gqa.suggest(optuna.trial.FixedTrial(gqa.params_of(arch))) == arch
        groups = arch.kv_groups()
        assert list(groups) == sorted(groups)  # group sizes never decrease with depth
        if not kv.get("kv_schedule"):
            assert len(set(groups)) == 1
        if "min_kv_heads" in kv:
            assert all(n >= 2 for n, g in zip(arch.kv_per_layer(), groups) if g > 1)
    rows = [gqa.row(m) for m in members[:20]] + [gqa.row(grouped[0])]
    assert all(row["key"] == m.key() for row, m in zip(rows, [*members[:20], grouped[0]]))
    assert all(set(gqa.table_columns) <= set(row) for row in rows)
    assert rows[-1]["kv_cache_bytes_per_token"] == grouped[0].kv_cache_bytes_per_token()
    assert "kv_groups" in gqa.describe()


def test_saved_parameters_go_to_the_ffn_in_prism_and_to_width_depth_or_ffn_on_the_hourglass_grid():
    prism = build_space(SpaceOptions(space="prism", kv_groups=(2, 3, 4, 6, 12)))
    base = prism.baseline()
    worst = 0.0
    for arch in prism:  # the cpu proxy: every member within 0.01 % of the baseline's 1,354,080 parameters
        worst = max(worst, abs(arch.n_params()["total"] / base.n_params()["total"] - 1))
        if arch.grouped:
            assert arch.ffn.hidden > base.ffn.hidden and (arch.d_model, arch.n_layers) == (96, 12)
    assert worst <= 1e-4
    grid = build_space(SpaceOptions(space="hourglass", kv_groups=(2, 4)))
    assert isinstance(grid, HourglassSpace) and grid.count() > 244
    for arch in grid:
        g = arch.kv_groups()[0]
        assert arch.d_model % (8 * g) == 0  # head dim 8, the head count a multiple of g
        assert arch.n_params()["attention"] == arch.n_layers * 2 * arch.d_model ** 2 * (g + 1) // g
    points = [grid.point_of(a) for a in grid if a.grouped]
    assert {p.kv_group for p in points} == {2, 4}
    assert len({(a.d_model, a.n_layers) for a in grid if a.grouped} - {(a.d_model, a.n_layers) for a in grid
                                                                      if not a.grouped}) > 0  # new widths
    fixed = build_space(SpaceOptions(space="hourglass", fix="attention", kv_groups=(2, 12)))
    by_k = {}
    for arch in fixed:
        assert (arch.d_model, arch.n_layers) == (96, 12)
        by_k.setdefault(arch.ffn.k, {})[arch.kv_groups()[0]] = arch.ffn.hidden
    assert all(hidden[1] < hidden[2] < hidden[12] for hidden in by_k.values())  # fixed attention: the FFN takes it


def test_counting_over_prism_schedules_equals_the_sum_over_each_schedule():
    """The programme over (Prism state, group state) pairs equals counting each schedule's group schedules."""
    for layers, heads, options, rule_options in [
        (8, 12, {}, {}),
        (9, 12, {"min_plateau": 1, "max_plateau": 3, "min_baseline": 3}, {"min_plateau": 1, "max_plateau": 2}),
        (7, 8, {"hw_aligned": True}, {"min_plateau": 3, "max_plateau": 3, "min_kv_heads": 2}),
        # plateaus at least as long as the depth (their runs counted only up to the shortest), and at its edge
        (8, 12, {"max_plateau": 4096, "min_baseline": 1}, {"max_plateau": 4096}),
        (6, 12, {"max_plateau": 6, "min_baseline": 1}, {"min_plateau": 1, "max_plateau": 5}),
        (6, 12, {"max_plateau": 5, "min_baseline": 1}, {"min_plateau": 3, "max_plateau": 6}),
        # limits that no valid schedule can pass: depth - min_baseline, depth - the key/value min_plateau
        (7, 12, {"max_plateau": 4, "min_baseline": 3}, {"min_plateau": 2, "max_plateau": 5}),
        (7, 12, {"max_plateau": 3, "min_baseline": 3}, {"min_plateau": 2, "max_plateau": 4}),
    ]:
        prism = PrismSpace(layers, 48 if heads == 12 else 64, heads, **options)
        rule = KVRule.build(heads, None, schedule=True, **{("min_kv_heads" if k == "min_kv_heads" else k): v
                                                           for k, v in rule_options.items()})
        listed_count = sum(rule.count(s) for s in prism.schedules())
        assert count_over_prism(rule, prism) == listed_count
        caps = Caps.of(rule, prism)  # both walks of the programme, whichever the space's size picks
        assert count_by_states(rule, prism, caps) == count_by_tables(rule, prism, caps) == listed_count
        for schedule in itertools.islice(prism.schedules(), 0, None, 7):
            listed = list(rule.group_schedules(schedule))
            assert len(listed) == rule.count(schedule)
            assert [rule.unrank(schedule, i) for i in range(len(listed))] == listed
            assert [rule.rank(schedule, g) for g in listed] == list(range(len(listed)))


def test_a_deep_space_with_long_plateaus_is_counted_by_blocks_of_states(monkeypatch):
    """Plateau limits well below the depth (40 of 64 layers here; 100 of 128 took 45 s) keep every plateau length
    apart: the state-by-state walk slowed with their square. The blocks give the count that walk gave."""
    prism = PrismSpace(64, 96, 12, max_plateau=40, min_baseline=4)
    rule = KVRule.build(12, None, schedule=True, max_plateau=40)
    assert Caps.of(rule, prism).cells >= TABLE_CELLS
    monkeypatch.setattr(kv_count, "count_by_states", listing_refused)
    assert count_over_prism(rule, prism) == 5406769050028  # count_by_states' answer, 10x slower


def listing_refused(*args, **kwargs):
    raise AssertionError("listed the schedules to count them")


def test_the_cpu_proxy_spaces_with_a_kv_schedule_are_counted_without_listing_them(monkeypatch):
    # listing the joint one would take hours: every way of listing a head or group schedule fails the test
    monkeypatch.setattr(PrismSpace, "schedules", listing_refused)
    monkeypatch.setattr(KVRule, "group_schedules", listing_refused)
    monkeypatch.setattr(KVScheduleSpace, "__iter__", listing_refused)
    counts = {name: build_space(SpaceOptions(space=name, kv_schedule=True)).count()
              for name in ("prism", "hourglass", "joint")}
    assert counts["prism"] == 32848 and counts["joint"] > 10**6


def test_tpe_proposes_only_members_with_stable_distributions():
    for kv in ({"kv_groups": (2, 3)}, {"kv_schedule": True}):
        space = build_space(small("joint", **kv))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(multivariate=True, group=True, seed=0, n_startup_trials=5)
        study = optuna.create_study(sampler=sampler)

        def objective(trial: optuna.Trial, space=space) -> float:
            arch = space.suggest(trial)
            return arch.kv_cache_bytes_per_token() / 1e3 + arch.ffn.k

        study.optimize(objective, 20)
        for trial in study.trials:
            arch = space.suggest(optuna.trial.FixedTrial(trial.params))
            assert space.validate(arch) == []


@pytest.mark.parametrize("kv, says", [
    ({"kv_groups": (5,)}, "group size 5 does not divide the baseline's 12 heads; valid group sizes are 1,2,3,4,6,12"),
    ({"kv_groups": (24,)}, "group size 24 is larger than the baseline's 12 heads; valid group sizes are"),
    ({"kv_groups": (12,), "min_kv_heads": 2}, "group size 12 leaves the baseline's 12 heads 1 key/value heads, fewer "
                                              "than --min-kv-heads 2; valid group sizes are 1,2,3,4,6"),
    ({"min_kv_heads": 2}, "--min-kv-heads applies with --kv-groups or --kv-schedule"),
    ({"kv_groups": (2,), "kv_max_plateau": 3}, "--kv-max-plateau applies with --kv-schedule"),
    ({"kv_schedule": True, "kv_min_plateau": 4, "kv_max_plateau": 3}, "--kv-min-plateau 4 > --kv-max-plateau 3"),
    ({"kv_groups": (1,)}, "group size 1 alone is multi-head attention"),
])
def test_bad_gqa_options_are_one_line_naming_what_is_valid(kv, says):
    for name in ("prism", "hourglass"):
        with pytest.raises(UsageError) as error:
            build_space(SpaceOptions(space=name, **kv))
        assert says in str(error.value) and "\n" not in str(error.value)


def test_a_budget_no_grouped_member_can_match_is_refused():
    space = build_space(SpaceOptions(space="hourglass", fix="attention", hidden_multiple=64, kv_groups=(2,)))
    with pytest.raises(UsageError, match="no grid point with grouped key/value heads matches the budget 1,354,080"):
        space.count()


def test_a_search_on_a_budget_no_grouped_member_can_match_is_one_line_exit_2_and_stores_nothing(tmp_path):
    database = tmp_path / "nas.db"
    result = CliRunner().invoke(app, ["search", "--space", "hourglass", "--fix", "attention", "--hidden-multiple", "64",
                                      "--kv-groups", "2", "--trials", "3", "--storage", f"sqlite:///{database}"])
    assert result.exit_code == 2, result.output
    assert "no grid point with grouped key/value heads matches the budget" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not database.exists()  # refused before the storage was made


@pytest.mark.parametrize("args, says", [
    (["count", "--space", "prism", "--kv-groups", "5"], "does not divide the baseline's 12 heads"),
    (["count", "--space", "joint", "--kv-groups", "2,x"], "is not a comma-separated list of ints"),
    (["show", "--space", "prism", "--kv-schedule", "--schedule", "12x12", "--kv", "6x11"],
     "gives 11 layers but the shape has 12"),
    (["show", "--space", "prism", "--kv-schedule", "--schedule", "12x12", "--kv", "6x99999999999999999999"],
     "--kv '6x99999999999999999999' gives more than 4,096 layers"),  # was an OverflowError traceback
    (["show", "--space", "hourglass", "--kv-groups", "2", "--config", "{config}", "--kv", "6x12"],
     "--kv applies to the prism space with --kv-groups"),
    (["show", "--space", "prism", "--config", "{bad}"], "kv_heads[layer 1]=5 does not divide that layer's 12 heads"),
])
def test_bad_input_on_the_command_line_is_one_line_exit_2(args, says, tmp_path):
    (tmp_path / "a.json").write_text(uniform(12, 96, 12, 256).to_json())
    (tmp_path / "bad.json").write_text(json.dumps({**uniform(12, 96, 12, 256).to_dict(), "kv_heads": [5] * 12}))
    args = [a.format(config=tmp_path / "a.json", bad=tmp_path / "bad.json") for a in args]
    result = CliRunner().invoke(app, ["space", *args])
    assert result.exit_code == 2, result.output
    assert says in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("space, layers", [("prism", MAX_LAYERS), ("joint", MAX_LAYERS // 2)])
def test_a_key_value_schedule_space_lists_at_the_deepest_depth_its_options_accept(space, layers):
    """Issue 52: the listing walked the schedules by recursion, one frame a layer, and raised RecursionError from
    about 1,000 layers while --layers accepts 4,096 (the joint space's default grid reaches twice its baseline)."""
    result = CliRunner().invoke(app, ["space", "list", "--space", space, "--layers", str(layers), "--kv-schedule",
                                      "--limit", "2", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(rows) == 3 and rows[1][rows[0].index("layers")] == str(layers)
    rule = KVRule.build(12, None, schedule=True)
    heads = (12,) * MAX_LAYERS
    first = next(iter(rule.group_schedules(heads)))
    assert first == (1,) * MAX_LAYERS and rule.rank(heads, first) == 0


def test_a_grid_whose_default_depths_pass_the_limit_is_refused_naming_the_depth_given():
    result = CliRunner().invoke(app, ["space", "count", "--space", "hourglass", "--layers", str(MAX_LAYERS)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert f"layers={MAX_LAYERS:,}: the grid's default depths reach 2x the baseline's" in result.stderr
    assert f"give layers up to {MAX_LAYERS // 2:,}" in result.stderr


@pytest.mark.parametrize("space", ["prism", "hourglass", "joint"])
@pytest.mark.parametrize("kv", [["--kv-groups", "2,3"], ["--kv-schedule"]], ids=["uniform", "schedule"])
def test_every_row_of_a_grouped_listing_has_the_same_columns(space, kv):
    """Issue 52 (seen on the way): a grouped member's row carried an is_baseline column that the Hourglass and
    joint rows of multi-head members lack, and the CSV writer, which takes its columns from the first row, raised."""
    options = ["--layers", "6", "--d-model", "48", "--heads", "6"]
    if space != "prism":
        options += ["--k-values", "1,2", "--layer-values", "3,6", "--ratio-values", "0.5,1.0"]
    result = CliRunner().invoke(app, ["space", "list", "--space", space, *options, *kv, "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(rows) > 2 and {len(r) for r in rows} == {len(rows[0])}
    kinds = {r[rows[0].index("kind")] for r in rows[1:]} if "kind" in rows[0] else set()
    assert space == "prism" or kv == ["--kv-groups", "2,3"] or {"baseline", "gqa"} <= kinds  # grouped baselines


def test_nas_space_show_checks_a_key_value_schedule_and_names_every_broken_rule():
    runner = CliRunner()
    ok = runner.invoke(app, ["space", "show", "--space", "prism", "--kv-schedule", "--schedule", "3x2,6x2,12x8",
                             "--kv", "3x2,3x2,6x2,3x6"])  # group sizes 1x2,2x4,4x6
    assert ok.exit_code == 0, ok.output
    assert "kv_groups: 1,1,2,2,2,2,4,4,4,4,4,4" in ok.stdout and "budget_deviation: +0.0000%" in ok.stdout
    bad = runner.invoke(app, ["space", "show", "--space", "prism", "--kv-schedule", "--schedule", "12x12",
                              "--kv", "3x4,12x8"])
    assert bad.exit_code == 1
    assert "group size 1 after 4 — group sizes must not decrease with depth" in bad.stdout
    uniform_only = runner.invoke(app, ["space", "show", "--space", "prism", "--kv-groups", "2,4", "--schedule",
                                       "12x12", "--kv", "6x6,3x6"])
    assert uniform_only.exit_code == 1 and "differ by layer" in uniform_only.stdout


def test_spaces_with_gqa_are_the_classes_the_options_name():
    assert isinstance(build_space(SpaceOptions(space="prism", kv_groups=(2,))), UniformGroupPrismSpace)
    assert isinstance(build_space(SpaceOptions(space="joint", kv_schedule=True)), KVScheduleSpace)
    joint = build_space(SpaceOptions(space="joint", kv_groups=(4,)))
    assert isinstance(joint, JointSpace) and joint.hourglass.kv_groups == (1, 4)
    identity = joint.describe()
    assert (identity["kv_groups"], identity["min_kv_heads"]) == ([1, 4], 1)


def test_the_gpu_gqa_preset_states_its_arithmetic_and_the_papers_presets_keep_their_meaning():
    from runners.presets import PRESETS, get_preset

    preset = get_preset("gpu-joint-gqa")
    options = preset.space_options(SpaceOptions(space="joint"))
    assert options.kv_groups == (2, 4, 12) and options.max_head_dim == 256
    joint = build_space(options, defaults=preset.baseline)
    plain = build_space(SpaceOptions(space="joint", max_head_dim=256), defaults=preset.baseline)
    assert (joint.count(), plain.count()) == (7817, 5761)
    assert "7,817 members" in preset.description and "5,761 without GQA" in preset.description
    base = preset.baseline
    assert [base.kv_cache_bytes_per_token() // g for g in (1, 4, 12)] == [36864, 9216, 3072]
    assert all(dict(p.space).get("kv_groups") is None for name, p in PRESETS.items() if name != "gpu-joint-gqa")
    result = CliRunner().invoke(app, ["presets"])
    assert "the 7817-member joint space is sampled" in result.stdout
    assert "KV cache 36,864 bytes/token at the baseline, 18,432 at group size 2" in result.stdout


@pytest.mark.parametrize("space", ["hourglass", "joint"])
def test_a_grouped_listing_row_gives_each_layers_key_value_heads_as_its_shape_has_them(space):
    """A joint row of h=2x2,6x2 kv=1x2,3x2 said "kv_heads": 3 (its uniform skeleton's, as one number)."""
    built = build_space(SpaceOptions(space=space, layers=4, d_model=32, heads=4, ffn_hidden=88, kv_groups=(2, 4)))
    for arch in itertools.islice(built, 400):
        row = built.row(arch)
        if "kv_heads" in row:
            assert row["kv_heads"] == list(arch.kv_per_layer()), row["key"]
