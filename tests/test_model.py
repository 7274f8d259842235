"""The torch model: exact parameter accounting, HF LLaMA logit parity, trainability at K=4 with a Prism schedule."""

from __future__ import annotations

import random

import pytest
import torch

from nas.arch import ArchConfig, FFNShape, divisors_up_to, uniform
from nas.model.transformer import Transformer
from search_spaces.prism import PrismSpace


def _numel(arch: ArchConfig) -> int:
    with torch.device("meta"):
        model = Transformer(arch)
    return sum(p.numel() for p in model.parameters())


def _random_arch(rng: random.Random) -> ArchConfig:
    layers = rng.randint(1, 6)
    d_model = rng.choice([8, 12, 24, 32, 48, 64, 96, 120])
    options = divisors_up_to(d_model, 16)
    heads = sorted(rng.choice(options) for _ in range(layers))
    return ArchConfig(n_layers=layers, d_model=d_model, heads=tuple(heads),
                      ffn=FFNShape(rng.randint(1, 8), rng.randint(1, 4 * d_model)),
                      vocab_size=rng.randint(2, 1000), tie_embeddings=rng.random() < 0.5)


def test_n_params_equals_numel_for_60_random_configs() -> None:
    rng = random.Random(1234)
    archs = [_random_arch(rng) for _ in range(60)]
    assert {a.tie_embeddings for a in archs} == {True, False}
    assert {a.ffn.k for a in archs} == set(range(1, 9))
    for arch in archs:
        assert arch.n_params()["total"] == _numel(arch), arch.key()


def test_every_prism_schedule_of_a_shape_has_the_same_parameter_count() -> None:
    space = PrismSpace(12, 768, 12, vocab_size=50304)
    counts = {_numel(arch) for arch in space}
    assert counts == {space.baseline().n_params()["total"]}
    assert space.count() == 129


def _to_hf(model: Transformer):
    """HF ``LlamaForCausalLM`` holding the model's weights, through the export's mapping (``nas.hf.mapping``)."""
    transformers = pytest.importorskip("transformers")
    from nas.hf.mapping import hf_state_dict, llama_config_fields

    arch = model.arch
    config = transformers.LlamaConfig(**llama_config_fields(arch, 512))
    hf = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    state = hf_state_dict(model.state_dict(), arch, "llama")
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if arch.tie_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf.eval()


@pytest.mark.parametrize("arch", [
    uniform(2, 64, 4, 320, FFNShape(1, 176), tie_embeddings=True),
    uniform(3, 96, 6, 500, FFNShape(1, 256), tie_embeddings=False),
], ids=["tied-d64", "untied-d96"])
def test_logits_match_hf_llama_with_the_same_weights(arch: ArchConfig) -> None:
    torch.manual_seed(0)
    model = Transformer(arch).eval()
    with torch.no_grad():  # non-trivial norm gains, so a mis-mapped norm would show
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    hf = _to_hf(model)
    idx = torch.randint(0, arch.vocab_size, (3, 57))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx, use_cache=False).logits
    rel = (ours - theirs).abs().max() / theirs.abs().max()
    assert rel <= 1e-5


@pytest.mark.parametrize("arch, T, blocked", [
    (uniform(2, 96, 12, 256, FFNShape(1, 256)), 128, True),  # the default proxy's head dim 8, its context 128
    (uniform(2, 96, 8, 300, FFNShape(1, 192), tie_embeddings=False), 100, True),  # head dim 12, 2 uneven blocks
    # the same two through BlockedCausalAttention (FusedCausalAttention takes them where its kernels are built)
    (uniform(2, 96, 12, 256, FFNShape(1, 256)), 128, "blocked"),
    (uniform(2, 96, 8, 300, FFNShape(1, 192), tie_embeddings=False), 100, "blocked"),
    (uniform(2, 64, 2, 256, FFNShape(1, 2048)), 200, True),  # head dim 32, 3 query blocks, GatedUpProjection
    (uniform(1, 32, 4, 256, FFNShape(1, 64)), 24, True),  # a single block shorter than QUERY_BLOCK
    (uniform(1, 32, 1, 256, FFNShape(1, 64)), 600, False),  # beyond BLOCKED_ATTENTION_MAX_T: SDPA
    # grouped-query attention: 12 query heads on 4 key/value heads (fused, then the grouped blocked kernel), 4 on 1
    # (SDPA)
    (uniform(2, 96, 12, 256, FFNShape(1, 256)).replace(kv_heads=[4, 4]), 128, True),
    (uniform(2, 96, 12, 256, FFNShape(1, 256)).replace(kv_heads=[4, 4]), 128, "blocked"),
    (uniform(1, 32, 4, 256, FFNShape(1, 64)).replace(kv_heads=[1]), 600, False),
], ids=["dh8-T128", "dh12-T100", "dh8-T128-blocked", "dh12-T100-blocked",
        "dh32-T200", "dh8-T24", "sdpa-T600", "gqa-dh8-T128", "gqa-dh8-T128-blocked",
        "mqa-sdpa-T600"])
def test_cpu_attention_paths_match_hf_in_logits_and_gradients(arch: ArchConfig, T: int, blocked: bool | str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            fused_attention_everywhere) -> None:
    """CPU training through FusedCausalAttention or BlockedCausalAttention (own forward and backward) or SDPA
    matches HF's eager LLaMA."""
    from nas.model import attention_kernels

    if blocked == "blocked":
        monkeypatch.setattr(attention_kernels, "FUSED_ATTENTION_HEAD_DIMS", ())
    # the path under test is taken (batch 3)
    assert attention_kernels.use_blocked_attention(torch.device("cpu"), 3 * arch.heads[0], T, 4) == bool(blocked)
    torch.manual_seed(0)
    model = Transformer(arch)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    hf = _to_hf(model).train()
    idx, targets = torch.randint(0, arch.vocab_size, (3, T)), torch.randint(0, arch.vocab_size, (3, T))
    ours = model(idx)
    theirs = hf(idx, use_cache=False).logits
    assert (ours - theirs).abs().max() / theirs.abs().max() <= 1e-5
    lossfn = torch.nn.functional.cross_entropy
    lossfn(ours.view(-1, arch.vocab_size), targets.view(-1)).backward()
    lossfn(theirs.view(-1, arch.vocab_size), targets.view(-1)).backward()
    hf_params = dict(hf.named_parameters())
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}.self_attn."
        pairs = [(block.attn.qkv.weight.grad,
                  torch.cat([hf_params[prefix + f"{n}_proj.weight"].grad for n in "qkv"])),
                 (block.attn.out.weight.grad, hf_params[prefix + "o_proj.weight"].grad),
                 (block.attn_norm.weight.grad, hf_params[f"model.layers.{i}.input_layernorm.weight"].grad)]
        for mine, reference in pairs:
            torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-5 * reference.abs().max().item())
    torch.testing.assert_close(model.embed.weight.grad, hf.model.embed_tokens.weight.grad, rtol=1e-4, atol=1e-7)


def test_prism_schedule_with_k4_overfits_one_batch() -> None:
    torch.manual_seed(0)
    arch = ArchConfig(n_layers=4, d_model=64, heads=(1, 1, 4, 4), ffn=FFNShape(4, 24), vocab_size=64)
    model = Transformer(arch)
    x = torch.randint(0, 64, (4, 32))
    y = torch.randint(0, 64, (4, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_attention_probabilities_are_causal_rows_that_sum_to_one() -> None:
    torch.manual_seed(0)
    arch = ArchConfig(n_layers=3, d_model=24, heads=(1, 3, 6), ffn=FFNShape(2, 8), vocab_size=50)
    model = Transformer(arch).eval()
    idx = torch.randint(0, 50, (2, 10))
    probs = model.attention_probabilities(idx)
    assert [p.shape for p in probs] == [(2, h, 10, 10) for h in arch.heads]
    for p in probs:
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        assert torch.all(p.triu(1) == 0)


@pytest.mark.parametrize("d_model, heads, T", [(32, (4, 2), 9), (48, (6, 4), 80)])  # SDPA; narrow-head path
def test_analysis_path_reproduces_the_fast_path(d_model: int, heads: tuple[int, ...], T: int) -> None:
    """``analyse`` materialises P and computes W_O (P V): same layer outputs and loss as the fast forward."""
    torch.manual_seed(0)
    arch = ArchConfig(n_layers=2, d_model=d_model, heads=heads, ffn=FFNShape(2, 16), vocab_size=40)
    model = Transformer(arch).eval()
    idx, targets = torch.randint(0, 40, (2, T)), torch.randint(0, 40, (2, T))
    attn, x = model.blocks[0].attn, model.blocks[0].attn_norm(model.embed(idx))
    with torch.no_grad():
        explicit, probs = attn.explicit(x)
        torch.testing.assert_close(explicit, attn(x), rtol=1e-5, atol=1e-6)
        loss, all_probs = model.analyse(idx, targets)
        torch.testing.assert_close(loss, model(idx, targets), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(all_probs[0], probs)
    assert [p.shape for p in all_probs] == [(2, h, T, T) for h in heads]


def test_odd_head_dims_use_partial_rotary() -> None:
    arch = ArchConfig(n_layers=2, d_model=24, heads=(8, 8), ffn=FFNShape(1, 16), vocab_size=30)  # head dim 3
    model = Transformer(arch)
    loss = model(torch.randint(0, 30, (2, 7)), torch.randint(0, 30, (2, 7)))
    assert torch.isfinite(loss)


def test_rms_norm_function_matches_autograd_through_f_rms_norm() -> None:
    """The hand-written RMSNorm backward: gradcheck in float64, and equal to F.rms_norm's autograd in fp32."""
    from nas.model.kernels import RMSNormFunction
    from nas.model.transformer import RMSNorm

    torch.manual_seed(0)
    x64 = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: RMSNormFunction.apply(a, b, 1e-5), (x64, w64))
    norm = RMSNorm(48, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (3 * torch.randn(4, 33, 48)).requires_grad_()
    dy = torch.randn(4, 33, 48)
    ours = norm(x)
    reference = torch.nn.functional.rms_norm(x, (48,), norm.weight, 1e-5)
    torch.testing.assert_close(ours, reference)
    mine = torch.autograd.grad(ours, (x, norm.weight), dy)
    theirs = torch.autograd.grad(reference, (x, norm.weight), dy)
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * b.abs().max().item())


def test_gated_up_projection_matches_autograd_through_the_fused_matmul() -> None:
    """The wide-FFN path (GatedUpProjection, own backward): gradcheck in float64, equal to autograd in fp32."""
    from nas.model.kernels import GATED_UP_MIN_ELEMENTS, GatedUpProjection
    from nas.model.transformer import SwiGLU

    torch.manual_seed(0)
    x64 = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w64 = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(GatedUpProjection.apply, (x64, w64))
    ffn = SwiGLU(64, 4096)
    x = torch.randn(2, 128, 64, requires_grad=True)
    assert 2 * 128 * 4096 >= GATED_UP_MIN_ELEMENTS  # the path under test is taken
    dy = torch.randn(2, 128, 64)
    gate, up = (x @ ffn.gate_up.weight.t()).chunk(2, dim=-1)
    reference = ffn.down(torch.nn.functional.silu(gate) * up)
    ours = ffn(x)
    torch.testing.assert_close(ours, reference)
    params = (x, ffn.gate_up.weight, ffn.down.weight)
    for mine, theirs in zip(torch.autograd.grad(ours, params, dy), torch.autograd.grad(reference, params, dy)):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5 * theirs.abs().max().item())


# ----------------------------------------------------------------- per-layer head counts vs an independent reference
PRISM_HEADS = (1, 2, 4, 8, 16, 32)  # head dims 256, 128, 64, 32, 16, 8 at d_model 256
# grouped-query attention per layer: groups of 1 (multi-head), 2, 4, 4, 8 and 32 (multi-query) query heads
PRISM_KV_HEADS = (1, 1, 1, 2, 2, 1)


def _hf_decoder_layers(model: Transformer):
    """One HF ``LlamaDecoderLayer`` per layer, each configured with *that layer's* head count and head dim, holding
    the layer's weights, with its own ``LlamaRotaryEmbedding``: an independent reference for per-layer schedules
    (HF's ``LlamaModel`` has one head count for every layer)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from nas.hf.mapping import hf_state_dict

    arch, layers = model.arch, []
    # the export's Prism layout (nas.hf.mapping): a layer's names are LLaMA's, except its one sub-MLP's (mlps.0)
    state = hf_state_dict(model.state_dict(), arch)
    for i, (h, kv) in enumerate(zip(arch.heads, arch.kv_per_layer())):
        config = transformers.LlamaConfig(
            vocab_size=arch.vocab_size, hidden_size=arch.d_model, intermediate_size=arch.ffn.hidden,
            num_hidden_layers=arch.n_layers, num_attention_heads=h, num_key_value_heads=kv,
            head_dim=arch.d_model // h, rms_norm_eps=arch.norm_eps, rope_theta=arch.rope_theta,
            max_position_embeddings=512, attention_bias=False, mlp_bias=False)
        config._attn_implementation = "sdpa"  # causal when no mask is given
        layer = LlamaDecoderLayer(config, layer_idx=i)
        prefix = f"model.layers.{i}."
        layer.load_state_dict({name.removeprefix(prefix).replace("mlps.0.norm", "post_attention_layernorm")
                               .replace("mlps.0.", "mlp."): tensor
                               for name, tensor in state.items() if name.startswith(prefix)})
        layers.append((layer.train(), LlamaRotaryEmbedding(config)))
    return layers


@pytest.mark.parametrize("kv_heads", [(), PRISM_KV_HEADS], ids=["mha", "gqa"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernels", "pytorch-ops"])
@pytest.mark.parametrize("T", [40, 130], ids=["T40-one-block", "T130-two-blocks"])
def test_a_prism_schedule_matches_hf_decoder_layers_built_per_layer(fused: bool, T: int, kv_heads,
                                                                   fused_attention_everywhere) -> None:
    """Layer by layer, a schedule with head dims 256 ... 8 equals HF LLaMA layers each built with that layer's own
    head count (and key/value head count: multi-head, or grouped-query per layer) and the same weights: every
    layer's output, the logits, and every parameter's gradient."""
    from nas.model import fused_cpu

    arch = ArchConfig(n_layers=len(PRISM_HEADS), d_model=256, heads=PRISM_HEADS, ffn=FFNShape(1, 96),
                      vocab_size=300, tie_embeddings=True, kv_heads=kv_heads)
    assert arch.grouped == bool(kv_heads)
    torch.manual_seed(0)
    model = Transformer(arch)
    with torch.no_grad():  # non-trivial norm gains, so a mis-mapped norm would show
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    reference = _hf_decoder_layers(model)
    embed = torch.nn.Embedding.from_pretrained(model.embed.weight.detach().clone(), freeze=False)
    final_norm = torch.nn.RMSNorm(arch.d_model, eps=arch.norm_eps)
    with torch.no_grad():
        final_norm.weight.copy_(model.norm.weight)
    idx, targets = torch.randint(0, arch.vocab_size, (2, T)), torch.randint(0, arch.vocab_size, (2, T))

    ours_per_layer: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda module, args, out: ours_per_layer.append(out))
             for block in model.blocks]
    with fused_cpu.enabled(fused):
        ours = model(idx)
        torch.nn.functional.cross_entropy(ours.view(-1, arch.vocab_size), targets.view(-1)).backward()
    for hook in hooks:
        hook.remove()

    x = embed(idx)
    positions = torch.arange(T).unsqueeze(0)
    for i, (layer, rotary) in enumerate(reference):
        x = layer(x, position_ids=positions, position_embeddings=rotary(x, positions))
        scale = x.abs().max()
        assert (ours_per_layer[i] - x).abs().max() / scale <= 2e-5, f"layer {i + 1} ({PRISM_HEADS[i]} heads)"
    theirs = torch.nn.functional.linear(final_norm(x), embed.weight)
    assert (ours - theirs).abs().max() / theirs.abs().max() <= 2e-5
    torch.nn.functional.cross_entropy(theirs.view(-1, arch.vocab_size), targets.view(-1)).backward()

    def close(mine: torch.Tensor, ref: torch.Tensor, what: str) -> None:
        assert (mine - ref).abs().max() <= 1e-4 * ref.abs().max() + 1e-9, what

    close(model.embed.weight.grad, embed.weight.grad, "embedding (tied with the output head)")
    close(model.norm.weight.grad, final_norm.weight.grad, "final norm")
    for i, (block, (layer, _)) in enumerate(zip(model.blocks, reference)):
        attn, mlp = layer.self_attn, layer.mlp
        close(block.attn.qkv.weight.grad, torch.cat([attn.q_proj.weight.grad, attn.k_proj.weight.grad,
                                                     attn.v_proj.weight.grad]), f"layer {i + 1} W_QKV")
        close(block.attn.out.weight.grad, attn.o_proj.weight.grad, f"layer {i + 1} W_O")
        close(block.ffns[0].gate_up.weight.grad, torch.cat([mlp.gate_proj.weight.grad, mlp.up_proj.weight.grad]),
              f"layer {i + 1} W_gate, W_up")
        close(block.ffns[0].down.weight.grad, mlp.down_proj.weight.grad, f"layer {i + 1} W_down")
        close(block.attn_norm.weight.grad, layer.input_layernorm.weight.grad, f"layer {i + 1} attention norm")
        close(block.ffn_norms[0].weight.grad, layer.post_attention_layernorm.weight.grad, f"layer {i + 1} FFN norm")
