"""Grouped-query attention (issue 38): per-layer key/value heads in the shape, its accounting and the model's kernels.

The model's parity with HF LLaMA layers built with each layer's ``num_key_value_heads`` is in ``tests/test_model.py``;
the export in ``tests/test_hf_export.py``; the spaces, options and bad input in ``tests/test_gqa_space.py``; the
objective, the report's answer, best/export rows and a real search in ``tests/test_gqa_search.py``.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from nas.arch import ArchConfig, FFNShape, divisors_up_to, uniform
from nas.configs import arch_from_json
from nas.errors import UsageError
from nas.model import fused_cpu
from nas.model.transformer import Transformer

BASE = uniform(12, 96, 12, 256)  # the cpu proxy's baseline


def _numel(arch: ArchConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(arch).parameters())


def test_a_multi_head_shape_keys_labels_and_serialises_as_before_grouped_query_attention():
    """Stored studies de-duplicate by key, and old JSON has no kv_heads: an MHA shape is unchanged in all three."""
    stored = ("L12-d96-h[12,12,12,12,12,12,12,12,12,12,12,12]-K1x256-V256-tied-rope10000-eps1e-05")
    assert BASE.key() == stored and BASE.label() == "h=12x12 K1x256 d96 L12"
    assert "kv_heads" not in BASE.to_dict()
    same = BASE.replace(kv_heads=[12] * 12)  # kv_l = h_l spelled out is multi-head attention
    assert same == BASE and same.key() == stored and same.kv_heads == () and not same.grouped
    old = json.loads(BASE.to_json())
    assert ArchConfig.from_dict(old) == BASE and ArchConfig.from_dict(old).kv_per_layer() == (12,) * 12


def test_a_grouped_shape_round_trips_and_names_its_key_value_heads():
    gqa = ArchConfig(n_layers=4, d_model=96, heads=(3, 3, 12, 12), kv_heads=(3, 1, 4, 2), ffn=FFNShape(1, 256),
                     vocab_size=256)
    assert gqa.key() == "L4-d96-h[3,3,12,12]-kv[3,1,4,2]-K1x256-V256-tied-rope10000-eps1e-05"
    assert gqa.label() == "h=3x2,12x2 kv=3x1,1x1,4x1,2x1 K1x256 d96 L4"
    assert gqa.kv_groups() == (1, 3, 3, 6) and gqa.grouped
    assert ArchConfig.from_json(gqa.to_json()) == gqa
    assert arch_from_json({"arch": gqa.to_dict(), "rank": 1}, "row") == gqa
    assert gqa.replace(heads=[6, 6, 12, 12]).kv_heads == (6, 2, 4, 2)  # group sizes kept
    with pytest.raises(UsageError, match="cannot keep the group sizes"):
        gqa.replace(heads=[4, 4, 12, 12])


@pytest.mark.parametrize("kv_heads, says", [
    ([5] * 12, r"kv_heads\[layer 1\]=5 does not divide that layer's 12 heads; valid key/value head counts are "
               r"1,2,3,4,6,12"),
    ([4] * 11, "kv_heads has 11 entries but n_layers=12"),
    ([0] * 12, r"kv_heads\[layer 1\]=0 does not divide"),
    (["4"] * 12, "kv_heads=.* is invalid"),
])
def test_a_bad_key_value_head_count_is_one_line_naming_what_is_valid(kv_heads, says):
    with pytest.raises(UsageError, match=says):
        BASE.replace(kv_heads=kv_heads)
    with pytest.raises(UsageError, match="kv_heads"):
        arch_from_json({**BASE.to_dict(), "kv_heads": 4}, "file")


def test_parameters_and_kv_cache_follow_the_key_value_heads_and_equal_the_built_model():
    """``n_params`` equals ``sum(p.numel())`` for random grouped shapes; W_K and W_V shrink to ``kv_l d_head_l x d``,
    the cache is ``2 sum_l kv_l d_head_l`` values a token, and the attention-score FLOPs do not change."""
    rng = random.Random(38)
    for _ in range(40):
        layers, d_model = rng.randint(1, 5), rng.choice([8, 12, 24, 48, 96])
        heads = sorted(rng.choice(divisors_up_to(d_model, 16)) for _ in range(layers))
        kv = [rng.choice(divisors_up_to(h, h)) for h in heads]
        arch = ArchConfig(n_layers=layers, d_model=d_model, heads=tuple(heads), kv_heads=tuple(kv),
                          ffn=FFNShape(rng.randint(1, 4), rng.randint(1, 64)), vocab_size=rng.randint(2, 300),
                          tie_embeddings=rng.random() < 0.5)
        assert arch.n_params()["total"] == _numel(arch), arch.key()
        head_dims = [d_model // h for h in heads]
        assert arch.kv_cache_bytes_per_token(4) == 2 * 4 * sum(n * dh for n, dh in zip(kv, head_dims))
    gqa = BASE.replace(kv_heads=[4] * 12)  # 3 query heads per key/value head
    saved = BASE.n_params()["attention"] - gqa.n_params()["attention"]
    assert saved == 12 * 2 * 96 * (96 - 4 * 8)  # W_K and W_V lose 8 heads of 8 rows each, per layer
    assert (BASE.kv_cache_bytes_per_token(), gqa.kv_cache_bytes_per_token()) == (2 * 12 * 96 * 2, 2 * 12 * 32 * 2)
    assert BASE.flops_per_token(128) - gqa.flops_per_token(128) == 6 * saved
    summary = gqa.summary()
    assert summary["kv_heads"] == [4] * 12 and summary["kv_cache_bytes_per_token"] == 1536
    assert BASE.summary()["kv_heads"] == [12] * 12 and BASE.summary()["kv_cache_bytes_per_token"] == 4608


@pytest.mark.parametrize("B, T, H, KV, Dh", [(2, 7, 6, 2, 8), (1, 5, 4, 1, 5), (3, 70, 8, 4, 16)])
def test_the_fused_grouped_rope_kernel_equals_the_pytorch_ops_forward_and_backward(B, T, H, KV, Dh):
    from nas.model.kernels import RotaryGroupedQKV
    from nas.model.transformer import RotaryTable

    if fused_cpu.library() is None:
        pytest.skip(f"fused kernels off: {fused_cpu.status()}")
    torch.manual_seed(0)
    qkv = torch.randn(B, T, (H + 2 * KV) * Dh, requires_grad=True)
    cos, sin = RotaryTable(Dh, 10000.0).table(T, qkv.device, qkv.dtype)
    grads = [torch.randn(B, H, T, Dh), torch.randn(B, KV, T, Dh), torch.randn(B, KV, T, Dh)]
    results = []
    for fused in (True, False):
        with fused_cpu.enabled(fused):
            out = RotaryGroupedQKV.apply(qkv, cos, sin, H, KV, 0.25)
            (d_qkv,) = torch.autograd.grad(out, qkv, grads)
        results.append((out, d_qkv))
    (fused_out, fused_grad), (plain_out, plain_grad) = results
    for mine, reference in zip(fused_out, plain_out):
        torch.testing.assert_close(mine, reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(fused_grad, plain_grad, rtol=1e-6, atol=1e-6)
    assert fused_out[0].shape == (B, H, T, Dh) and fused_out[1].shape == fused_out[2].shape == (B, KV, T, Dh)


def _multi_head_twin(model: Transformer) -> Transformer:
    """The multi-head model that repeats each key/value head's weights for its group (HF's repeat_kv order)."""
    arch = model.arch
    twin = Transformer(arch.replace(kv_heads=list(arch.heads)))
    state = model.state_dict()
    for i, (h, kv) in enumerate(zip(arch.heads, arch.kv_per_layer())):
        dh = arch.d_model // h
        q, k, v = state[f"blocks.{i}.attn.qkv.weight"].split([h * dh, kv * dh, kv * dh])
        state[f"blocks.{i}.attn.qkv.weight"] = torch.cat(
            [q, *(w.view(kv, dh, -1).repeat_interleave(h // kv, 0).reshape(h * dh, -1) for w in (k, v))])
    twin.load_state_dict(state)
    return twin


@pytest.mark.parametrize("T, reference_ops", [(130, False), (600, False), (64, True)],
                         ids=["grouped-blocked-T130", "sdpa-enable-gqa-T600", "reference-ops"])
def test_every_attention_path_of_a_grouped_layer_equals_its_multi_head_twin(T, reference_ops):
    """Blocked (head dims 8 and 16: transposed and plain products), SDPA's ``enable_gqa``, the reference ops and the
    analysis path all give the logits of the twin with repeated key/value weights, and gradients summed per group."""
    arch = ArchConfig(n_layers=2, d_model=96, heads=(6, 12), kv_heads=(2, 1), ffn=FFNShape(1, 64), vocab_size=100)
    torch.manual_seed(1)
    model = Transformer(arch).use_reference_ops(reference_ops)
    twin = _multi_head_twin(model).use_reference_ops(reference_ops)
    idx = torch.randint(0, 100, (2, T))
    ours, theirs = model(idx), twin(idx)
    assert float((ours - theirs).detach().abs().max() / theirs.detach().abs().max()) < 1e-5
    ours.square().mean().backward()
    theirs.square().mean().backward()
    for i, (h, kv) in enumerate(zip(arch.heads, arch.kv_heads)):
        dh = arch.d_model // h
        q, k, v = twin.blocks[i].attn.qkv.weight.grad.split([h * dh] * 3)
        expected = torch.cat([q, *(g.view(kv, h // kv, dh, -1).sum(1).reshape(kv * dh, -1) for g in (k, v))])
        torch.testing.assert_close(model.blocks[i].attn.qkv.weight.grad, expected, rtol=1e-4,
                                   atol=1e-5 * expected.abs().max().item())
    with torch.no_grad():
        logits, probs = model.analyse(idx[:, :48])
        assert float((logits - model(idx[:, :48])).abs().max()) < 1e-4
    assert [p.shape[1] for p in probs] == [6, 12]  # one map per query head
    torch.testing.assert_close(probs[1].sum(-1), torch.ones(2, 12, 48))


def test_the_attention_observer_sees_every_query_head_of_a_grouped_layer():
    """The proxy's attention distances read the kernel's own probability blocks: (B h_l, Tb, keys), batch-major."""
    arch = ArchConfig(n_layers=1, d_model=32, heads=(4,), kv_heads=(2,), ffn=FFNShape(1, 16), vocab_size=50)
    model = Transformer(arch)
    idx = torch.randint(0, 50, (3, 70))
    seen: list[tuple[int, tuple[int, ...]]] = []
    with torch.no_grad():
        model(idx, observe=lambda layer, r0, p: seen.append((r0, tuple(p.shape))))
        explicit = model.attention_probabilities(idx)[0]  # (B, h, T, T)
    assert seen == [(0, (12, 70, 70))]
    blocks: list[torch.Tensor] = []
    with torch.no_grad():
        model(idx, observe=lambda layer, r0, p: blocks.append(p.clone()))
    torch.testing.assert_close(blocks[0].view(3, 4, 70, 70), explicit, rtol=1e-5, atol=1e-6)
