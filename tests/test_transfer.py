"""Carrying proxy shapes to target presets: counts or ratios for head schedules, a re-solved width for hourglasses."""

from __future__ import annotations

import pytest

from nas.arch import ArchConfig
from runners.presets import get_preset
from search_spaces.factory import SpaceOptions, build_space
from search_spaces.hourglass import HourglassSpace
from search_spaces.prism import PrismSpace
from search_spaces.transfer import transfer_heads, transfer_shape

CPU = get_preset("cpu").baseline
GPT2 = get_preset("gpt2-124m").baseline
MEDIUM = get_preset("gpt2-354m").baseline


def carry(space_name: str, arch: ArchConfig, target: ArchConfig):
    space = build_space(SpaceOptions(space=space_name), defaults=CPU)
    return transfer_shape(arch, space.describe(), space.baseline(), target)


def test_a_12_layer_proxy_schedule_carries_its_head_counts_to_gpt2_small():
    schedule = (3, 3, 6, 6, 12, 12, 12, 12, 12, 12, 12, 12)
    carried = carry("prism", CPU.replace(heads=list(schedule)), GPT2)
    assert carried.ok and carried.target.heads == schedule  # 12 x 12 at both: the counts carry
    assert carried.target.d_model == 768 and carried.target.head_dims()[:2] == (256, 256)
    assert carried.target.n_params() == GPT2.n_params()  # a schedule changes no parameter
    assert PrismSpace(12, 768, 12, vocab_size=GPT2.vocab_size, ffn=GPT2.ffn).validate(carried.target) == []
    assert "head counts carried unchanged" in " ".join(carried.rules)
    # every one of the proxy's 129 schedules carries
    space = build_space(SpaceOptions(space="prism"), defaults=CPU)
    assert all(transfer_shape(a, space.describe(), space.baseline(), GPT2).ok for a in space)


def test_other_bases_carry_the_ratio_to_h_base_stretched_over_depth():
    carried = carry("prism", CPU.replace(heads=[3, 3, 6, 6] + [12] * 8), MEDIUM)  # L24, h_base 16
    assert carried.ok and carried.target.heads == (4,) * 4 + (8,) * 4 + (16,) * 16
    assert "ratios h_l/h_base carried" in " ".join(carried.rules)


def test_a_shape_that_cannot_carry_is_refused_with_its_reason():
    refused = carry("prism", CPU.replace(heads=[8, 8, 8] + [12] * 9), MEDIUM)
    assert not refused.ok and refused.target is None
    assert refused.refused == ("8 of 12 heads is 2/3 of h_base; at the target's h_base=16 that is 10.7 heads, not a "
                               "whole head count")
    # what is carried is checked again against the target's Prism rules
    bad = transfer_heads((12, 12, 2, 2) + (12,) * 8, GPT2)
    assert isinstance(bad, str) and "not a valid Prism schedule" in bad and "must not decrease" in bad


def test_an_hourglass_shape_is_re_solved_within_the_budget_tolerance_at_the_target():
    space = build_space(SpaceOptions(space="hourglass"), defaults=CPU)
    budget = GPT2.n_params()["total"]
    deep = [a for a in space if a.ffn.k >= 4]
    assert deep
    for arch in deep:
        carried = transfer_shape(arch, space.describe(), space.baseline(), GPT2)
        if not carried.ok:
            assert "has no shape for" in carried.refused
            continue
        t = carried.target
        assert t.ffn.k == arch.ffn.k and t.n_layers == arch.n_layers  # K and depth kept (both bases have L12)
        assert abs(t.ffn.hidden / t.d_model - arch.ffn.hidden / arch.d_model) <= 0.15 * arch.ffn.hidden / arch.d_model
        assert t.d_model % 64 == 0 and t.heads == (t.d_model // 64,) * t.n_layers  # the target's head dim
        assert abs(t.n_params()["total"] - budget) <= 0.001 * budget and t.vocab_size == GPT2.vocab_size


def test_fixed_attention_and_joint_shapes_carry_too():
    fixed = HourglassSpace(12, 96, 12, fix="attention", tolerance=0.01)
    member = next(a for a in fixed if a.ffn.k == 4)
    carried = transfer_shape(member, fixed.describe(), fixed.baseline(), GPT2)
    assert carried.ok and (carried.target.d_model, carried.target.n_layers, carried.target.ffn.k) == (768, 12, 4)
    joint = build_space(SpaceOptions(space="joint"), defaults=CPU)
    staircase = next(a for a in joint if a.ffn.k > 1 and len(set(a.heads)) > 1)
    carried = transfer_shape(staircase, joint.describe(), joint.baseline(), GPT2)
    if carried.ok:
        assert carried.target.ffn.k == staircase.ffn.k and len(set(carried.target.heads)) > 1
    else:
        assert carried.refused


def test_the_baseline_carries_to_the_targets_baseline():
    for name in ("prism", "hourglass", "joint"):
        space = build_space(SpaceOptions(space=name), defaults=CPU)
        assert transfer_shape(space.baseline(), space.describe(), space.baseline(), GPT2).target == GPT2


@pytest.mark.parametrize("target", ["gpt2-124m", "gpt2-354m", "prism-757m", "hourglass-113m", "cpu-long"])
def test_every_transfer_is_a_valid_shape_or_a_one_line_refusal(target):
    base = get_preset(target).baseline
    space = build_space(SpaceOptions(space="prism"), defaults=CPU)
    for arch in list(space)[::7]:
        carried = transfer_shape(arch, space.describe(), space.baseline(), base)
        assert (carried.target is None) == bool(carried.refused)
        if carried.ok:
            assert carried.target.n_params() == base.n_params() and carried.target.n_layers == base.n_layers
        else:
            assert "\n" not in carried.refused
