"""prism-nas shapes and weights in Hugging Face's names: the Prism remote-code layout, and stock LLaMA.

``nas.model.Transformer`` keeps W_Q, W_K, W_V as the row blocks of one ``attn.qkv`` weight and
W_gate, W_up as the row blocks of one ``gate_up`` weight per sub-MLP; HF keeps them apart. The
names, project -> HF (``{l}`` a layer, ``{k}`` a sub-MLP of its Hourglass stack)::

    embed.weight                        model.embed_tokens.weight
    blocks.{l}.attn_norm.weight         model.layers.{l}.input_layernorm.weight
    blocks.{l}.attn.qkv.weight          model.layers.{l}.self_attn.{q,k,v}_proj.weight  (rows: h_l, kv_l, kv_l heads)
    blocks.{l}.attn.out.weight          model.layers.{l}.self_attn.o_proj.weight
    blocks.{l}.ffn_norms.{k}.weight     model.layers.{l}.mlps.{k}.norm.weight
    blocks.{l}.ffns.{k}.gate_up.weight  model.layers.{l}.mlps.{k}.{gate,up}_proj.weight  (rows split in 2)
    blocks.{l}.ffns.{k}.down.weight     model.layers.{l}.mlps.{k}.down_proj.weight
    norm.weight                         model.norm.weight
    lm_head.weight                      lm_head.weight  (untied only)

In the LLaMA layout (K = 1) the sub-MLP's norm is ``post_attention_layernorm`` and the sub-MLP
``mlp``: ``model.layers.{l}.post_attention_layernorm.weight``, ``model.layers.{l}.mlp.gate_proj.weight``.
The LLaMA layout exists for the shapes LLaMA can express (``llama_refusal``): the same head count
and key/value head count in every layer, K = 1, no wider sub-MLP, an even head size. Grouped-query
layers (``kv_l < h_l``) keep ``kv_l`` heads in k_proj and v_proj, each serving ``h_l / kv_l`` query
heads in HF's ``repeat_kv`` order (``num_key_value_heads``), as the project's model does. Both layouts
compute the same function as the project's model (tests compare logits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nas.arch import ArchConfig, format_plateaus

if TYPE_CHECKING:
    import torch

LAYOUTS = ("prism", "llama")
PRISM_FILES = ("configuration_prism.py", "modeling_prism.py")  # nas/hf/remote/, copied into the model directory
AUTO_MAP = {"AutoConfig": "configuration_prism.PrismConfig",
            "AutoModelForCausalLM": "modeling_prism.PrismForCausalLM"}
INITIALIZER_RANGE = 0.02  # nas.model.transformer.INIT_STD, what a fresh HF model draws from


def llama_refusal(arch: ArchConfig) -> str | None:
    """Why ``LlamaForCausalLM`` cannot hold ``arch`` (None when it can)."""
    if len(set(arch.heads)) > 1:
        return f"its head count differs by layer ({format_plateaus(arch.heads)}); LLaMA has one for every layer"
    if len(set(arch.kv_per_layer())) > 1:
        return (f"its key/value head count differs by layer ({format_plateaus(arch.kv_per_layer())}); LLaMA has one "
                "for every layer")
    if arch.ffn.k > 1:
        return f"its FFN stacks K={arch.ffn.k} sub-MLPs; LLaMA has one"
    if arch.ffn.wider:
        return f"{arch.ffn.wider} of its sub-MLPs are one wider than the others; LLaMA's are all alike"
    if arch.d_model // arch.heads[0] % 2:
        return f"its head size {arch.d_model // arch.heads[0]} is odd; LLaMA's RoPE rotates channel pairs"
    return None


def hf_state_dict(state: Mapping[str, torch.Tensor], arch: ArchConfig, layout: str = "prism") -> dict[str, Any]:
    """``Transformer.state_dict()`` in HF names (see the module docstring); fresh contiguous tensors that share no
    memory (what safetensors requires)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")
    if layout == "llama" and (why := llama_refusal(arch)):
        raise ValueError(f"{arch.label()} is no LLaMA: {why}")
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"]}
    for layer in range(arch.n_layers):
        ours, theirs = f"blocks.{layer}.", f"model.layers.{layer}."
        head_dim = arch.d_model // arch.heads[layer]
        kv_rows = arch.kv_per_layer()[layer] * head_dim
        q, k, v = state[ours + "attn.qkv.weight"].split([arch.d_model, kv_rows, kv_rows], dim=0)
        out.update({theirs + "input_layernorm.weight": state[ours + "attn_norm.weight"],
                    theirs + "self_attn.q_proj.weight": q, theirs + "self_attn.k_proj.weight": k,
                    theirs + "self_attn.v_proj.weight": v,
                    theirs + "self_attn.o_proj.weight": state[ours + "attn.out.weight"]})
        for index in range(arch.ffn.k):
            gate, up = state[f"{ours}ffns.{index}.gate_up.weight"].chunk(2, dim=0)
            mlp = f"{theirs}mlps.{index}." if layout == "prism" else f"{theirs}mlp."
            norm = f"{mlp}norm.weight" if layout == "prism" else f"{theirs}post_attention_layernorm.weight"
            out.update({norm: state[f"{ours}ffn_norms.{index}.weight"], mlp + "gate_proj.weight": gate,
                        mlp + "up_proj.weight": up, mlp + "down_proj.weight": state[f"{ours}ffns.{index}.down.weight"]})
    if not arch.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    return {name: tensor.detach().clone().contiguous() for name, tensor in out.items()}


def prism_config(arch: ArchConfig, context: int) -> dict[str, Any]:
    """``config.json`` of the Prism layout (``nas/hf/remote/configuration_prism.py`` reads it)."""
    return {
        "architectures": ["PrismForCausalLM"],
        "auto_map": AUTO_MAP,
        "model_type": "prism",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.d_model,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": list(arch.heads),
        "num_key_value_heads": list(arch.kv_per_layer()),  # grouped-query layers share each among h_l / kv_l
        "ffn_num_mlps": arch.ffn.k,
        "intermediate_size": arch.ffn.hidden,
        "ffn_wider": arch.ffn.wider,
        "rms_norm_eps": arch.norm_eps,
        "rope_theta": arch.rope_theta,
        "max_position_embeddings": context,
        "tie_word_embeddings": arch.tie_embeddings,
        "initializer_range": INITIALIZER_RANGE,
        "hidden_act": "silu",
        "use_cache": True,
        "torch_dtype": "float32",
    }


def llama_config_fields(arch: ArchConfig, context: int) -> dict[str, Any]:
    """The ``transformers.LlamaConfig`` arguments that make it ``arch`` (uniform heads, K = 1)."""
    if why := llama_refusal(arch):
        raise ValueError(f"{arch.label()} is no LLaMA: {why}")
    return {
        "vocab_size": arch.vocab_size, "hidden_size": arch.d_model, "intermediate_size": arch.ffn.hidden,
        "num_hidden_layers": arch.n_layers, "num_attention_heads": arch.heads[0],
        "num_key_value_heads": arch.kv_per_layer()[0], "head_dim": arch.d_model // arch.heads[0],
        "rms_norm_eps": arch.norm_eps, "rope_theta": arch.rope_theta, "tie_word_embeddings": arch.tie_embeddings,
        "max_position_embeddings": context, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
        "initializer_range": INITIALIZER_RANGE,
    }


def llama_config(arch: ArchConfig, context: int) -> dict[str, Any]:
    """``config.json`` of a stock ``LlamaForCausalLM`` (no remote code). ``rope_theta`` is written both as
    transformers 4 reads it and as 5 does (``rope_parameters``); the token ids are unset, since LlamaConfig's
    defaults (bos 1, eos 2) would stop generation at token 2 of a byte-level vocabulary."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **llama_config_fields(arch, context),
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "use_cache": True,
        "torch_dtype": "float32",
    }
