"""Shapes compared at one seed see the same data in the same order, and Prism members start from the same weights.

The paired comparisons of the race (``nas.stats.race``) and of ``nas best`` rely on this: at a
common seed, the part of the score that comes from the data order and the initial weights is
shared, and the paired difference keeps only what the shape changes.
"""

from __future__ import annotations

import torch

import runners.proxy as proxy
from nas.data.loading import BatchSampler
from nas.model.transformer import Transformer
from runners.presets import get_preset

TINY = get_preset("tiny")
STAIRCASE = TINY.baseline.replace(heads=[1, 2, 4, 4])


def batches_seen(arch, cfg, data, monkeypatch) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    original = BatchSampler.next

    def recording(self):
        x, y = original(self)
        seen.append(x.clone())
        return x, y

    monkeypatch.setattr(BatchSampler, "next", recording)
    result = proxy.run(arch, cfg, data)
    monkeypatch.setattr(BatchSampler, "next", original)
    assert result.status == "ok", result.reason
    return seen


def test_every_shape_trains_on_the_same_batches_at_a_seed(builtin_data, monkeypatch) -> None:
    cfg = TINY.train.with_(tokens=1024)
    uniform_batches = batches_seen(TINY.baseline, cfg, builtin_data, monkeypatch)
    staircase_batches = batches_seen(STAIRCASE, cfg, builtin_data, monkeypatch)
    assert len(uniform_batches) == cfg.steps
    assert all(torch.equal(a, b) for a, b in zip(uniform_batches, staircase_batches, strict=True))
    other_seed = batches_seen(TINY.baseline, cfg.with_(seed=cfg.seed + 1), builtin_data, monkeypatch)
    assert not torch.equal(uniform_batches[0], other_seed[0])


def test_prism_members_start_from_the_same_weights_at_a_seed() -> None:
    torch.manual_seed(3)
    uniform_model = Transformer(TINY.baseline)
    torch.manual_seed(3)
    staircase_model = Transformer(STAIRCASE)
    a, b = uniform_model.state_dict(), staircase_model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)  # the head count only regroups the same projections


def test_the_weight_average_is_what_gets_scored(builtin_data) -> None:
    cfg = TINY.train.with_(tokens=1024)
    plain = proxy.run(TINY.baseline, cfg, builtin_data)
    averaged = proxy.run(TINY.baseline, cfg.with_(ema_decay=0.9), builtin_data)
    assert plain.train_curve == averaged.train_curve  # averaging does not change the training
    assert plain.eval_curve[:-1] == averaged.eval_curve[:-1]  # nor the pruning points
    assert averaged.val_loss != plain.val_loss and averaged.eval_curve[-1][1] == averaged.val_loss
