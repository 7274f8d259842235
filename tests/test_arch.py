"""ArchConfig: validation messages, JSON round-trip, canonical keys, exact accounting formulas."""

from __future__ import annotations

import pytest

from nas.arch import ArchConfig, FFNShape, llama_ffn_hidden, uniform
from nas.errors import UsageError


def test_gpt2_small_preset_parameter_count_is_stated_exactly() -> None:
    # L=12, d=768, 12 heads, vocab 50304 tied, SwiGLU hidden 2048:
    # embedding 50304*768 = 38,633,472; attention 12*4*768^2 = 28,311,552;
    # ffn 12*3*768*2048 = 56,623,104; norms 12*2*768 + 768 = 19,200.
    arch = uniform(12, 768, 12, 50304, FFNShape(1, 2048))
    assert arch.n_params() == {
        "embedding": 38_633_472, "attention": 28_311_552, "ffn": 56_623_104, "norm": 19_200,
        "total": 123_587_328, "non_embedding": 84_953_856,
    }


def test_flops_per_token_follows_the_palm_formula() -> None:
    arch = uniform(12, 768, 12, 50304, FFNShape(1, 2048))
    n_matmul = 28_311_552 + 56_623_104 + 50304 * 768
    assert arch.flops_per_token(1024) == 6 * n_matmul + 12 * 12 * 768 * 1024


def test_flops_and_params_do_not_depend_on_the_head_schedule() -> None:
    uniform_arch = uniform(12, 768, 12, 256)
    prism = uniform_arch.replace(heads=[3, 3, 6, 6] + [12] * 8)
    assert prism.n_params() == uniform_arch.n_params()
    assert prism.flops_per_token(512) == uniform_arch.flops_per_token(512)


def test_json_round_trip_and_key() -> None:
    arch = ArchConfig(n_layers=4, d_model=64, heads=(1, 2, 4, 4), ffn=FFNShape(4, 24), vocab_size=300,
                      tie_embeddings=False)
    again = ArchConfig.from_json(arch.to_json())
    assert again == arch and again.key() == arch.key()
    assert arch.key() != arch.replace(heads=[2, 2, 4, 4]).key()
    assert "K4x24" in arch.key() and "h[1,2,4,4]" in arch.key()


def test_llama_ffn_hidden_rounds_two_thirds_of_four_d() -> None:
    assert llama_ffn_hidden(4096) == 11008  # LLaMA-7B
    assert llama_ffn_hidden(768) == 2048


@pytest.mark.parametrize(("changes", "message"), [
    ({"heads": (7,) * 4}, "heads[layer 1]=7 does not divide d_model=64; divisors <= 7 are 1,2,4"),
    ({"heads": (4,) * 3}, "heads has 3 entries but n_layers=4"),
    ({"d_model": 0}, "d_model=0 is invalid"),
    ({"vocab_size": -1}, "vocab_size=-1 is invalid"),
    ({"ffn": FFNShape(1, 8), "n_layers": 0}, "n_layers=0 is invalid"),
])
def test_invalid_configs_raise_one_clear_error(changes: dict, message: str) -> None:
    data = {"n_layers": 4, "d_model": 64, "heads": (4,) * 4, "ffn": FFNShape(1, 128), "vocab_size": 256}
    data.update(changes)
    with pytest.raises(UsageError) as info:
        ArchConfig(**data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("k", "hidden", "message"), [(0, 8, "ffn.k=0"), (2, 0, "ffn.hidden=0")])
def test_invalid_ffn_shape(k: int, hidden: int, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        FFNShape(k, hidden)


def test_unknown_json_field_is_named() -> None:
    with pytest.raises(UsageError, match="unknown ArchConfig field"):
        ArchConfig.from_dict({"n_layers": 1, "d_model": 8, "heads": [2], "ffn": {"k": 1, "hidden": 8},
                              "vocab_size": 10, "colour": "red"})
