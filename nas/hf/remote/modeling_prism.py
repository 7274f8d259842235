"""A Prism / Hourglass decoder (exported by prism-nas) as a ``transformers`` causal LM.

Per layer ``l`` (pre-norm residual, LLaMA conventions: RMSNorm, RoPE with ``rotate_half``, SwiGLU)::

    x = x + o_proj(SDPA(RoPE(q_proj n), RoPE(k_proj n), v_proj n))    n = RMSNorm(x), h_l heads of d / h_l
    for k in 1..K:  x = x + down_proj_k(silu(gate_proj_k m) * up_proj_k m)    m = RMSNorm_k(x)

With the same head count in every layer and K = 1 this is ``LlamaForCausalLM``. A layer's head count
only changes a ``view``; each head size has its own rotary table (an odd head size rotates its first
``size - 1`` channels, as prism-nas does). Keys and values are cached per layer (``DynamicCache``), so
``generate()`` feeds one token a step; ``num_key_value_heads[l] < num_attention_heads[l]`` shares each
key/value head among a group of query heads (grouped-query attention, HF's ``repeat_kv`` order).

This file depends on ``torch`` and ``transformers`` (>= 4.46; tested with 4.46, 4.57 and 5.24) only: it travels
with the model directory.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from .configuration_prism import PrismConfig

logger = logging.get_logger(__name__)

# 4.46 is the first transformers whose generate() prepares a cached model's inputs itself
if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (4, 46):
    raise ImportError(f"this model's code needs transformers >= 4.46, found {transformers.__version__}")
# transformers 5 names the cache ``cache`` in forward and outputs and ties weights by a {target: source} map;
# 4.x names it ``past_key_values`` and lists the tied targets
_CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_V5 = int(transformers.__version__.split(".")[0]) >= 5


class PrismRMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * g`` (Zhang & Sennrich 2019), computed in fp32 as LLaMA does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B, 1, T, rot/2) of ``theta_i = base^(-2i/rot)`` at ``positions`` (B, T) (Su et al. 2021)."""
    rot = head_dim - head_dim % 2
    channels = torch.arange(0, rot, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (channels / rot))  # (rot/2,)
    freqs = positions[..., None].float() * inv_freq  # (B, T, rot/2)
    return freqs.cos().to(dtype)[:, None], freqs.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (B, H, T, Dh), HF's ``rotate_half`` pairing: channel i of the first half with channel i of the second."""
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * half:]], dim=-1)


class PrismAttention(nn.Module):
    """Causal attention with this layer's own head count (and key/value head count)."""

    def __init__(self, config: PrismConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv = config.num_attention_heads[layer_idx], config.num_key_value_heads[layer_idx]
        self.head_dim = config.head_dim(layer_idx)
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.o_proj.writes_residual = True  # scaled initialisation (PrismPreTrainedModel._init_weights)

    def forward(self, x: torch.Tensor, rotary: dict[int, tuple[torch.Tensor, torch.Tensor]],
                bias: torch.Tensor | None, cache: Cache | None) -> torch.Tensor:
        B, T, _ = x.shape
        cos, sin = rotary[self.head_dim]
        q = apply_rotary(self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = apply_rotary(self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, kv, T, Dh)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, kv, past + T, Dh)
        if self.n_kv != self.n_heads:  # key/value head j serves query heads j*g .. j*g + g - 1
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=bias is None and T > 1,
                                           scale=1.0 / math.sqrt(self.head_dim))  # (B, H, T, Dh)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class PrismMLP(nn.Module):
    """One residual sub-MLP of the Hourglass stack: its own RMSNorm, then SwiGLU (Shazeer 2020)."""

    def __init__(self, config: PrismConfig, hidden: int) -> None:
        super().__init__()
        self.norm = PrismRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_proj = nn.Linear(config.hidden_size, hidden, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, config.hidden_size, bias=False)
        self.down_proj.writes_residual = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


class PrismDecoderLayer(nn.Module):
    """Attention, then the K residual sub-MLPs."""

    def __init__(self, config: PrismConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = PrismRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = PrismAttention(config, layer_idx)
        self.mlps = nn.ModuleList(PrismMLP(config, config.mlp_size(layer_idx, i)) for i in range(config.ffn_num_mlps))

    def forward(self, x: torch.Tensor, rotary: dict[int, tuple[torch.Tensor, torch.Tensor]],
                bias: torch.Tensor | None, cache: Cache | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, bias, cache)
        for mlp in self.mlps:
            x = mlp(x)
        return x


class PrismPreTrainedModel(PreTrainedModel):
    config_class = PrismConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["PrismDecoderLayer"]
    _supports_sdpa = True
    _supports_cache_class = True  # transformers 4.x: generate() hands it a DynamicCache

    def _init_weights(self, module: nn.Module) -> None:
        """prism-nas's initialisation: N(0, 0.02), norm gains 1, and the projections that write into the residual
        stream (o_proj, every down_proj) N(0, 0.02 / sqrt(L (1 + K))), one term per residual branch."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            branches = self.config.num_hidden_layers * (1 + self.config.ffn_num_mlps)
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(branches) if getattr(module, "writes_residual", False)
                            else std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, PrismRMSNorm):
            nn.init.ones_(module.weight)


def attention_bias(attention_mask: torch.Tensor | None, q_len: int, past: int,
                   dtype: torch.dtype) -> torch.Tensor | None:
    """The additive (B or 1, 1, T, past + T) mask: causal from position ``past`` on, padding keys masked; None when
    SDPA's own causal mask is exact (no padding, and no cache or one new token)."""
    if attention_mask is not None and attention_mask.dim() == 4:  # the caller's own
        if attention_mask.dtype == torch.bool:
            return torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device).masked_fill(
                ~attention_mask, torch.finfo(dtype).min)
        return attention_mask.to(dtype)
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None
    if attention_mask is None and (past == 0 or q_len == 1):
        return None
    device = attention_mask.device if attention_mask is not None else None
    keys = torch.arange(past + q_len, device=device)
    allowed = keys[None, :] <= keys[past:, None]  # (T, S)
    allowed = allowed[None, None]  # (1, 1, T, S)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :past + q_len].bool()
    # finfo.min, not -inf: a query that sees only padding averages it instead of giving NaN
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


class PrismModel(PrismPreTrainedModel):
    """Embedding, the decoder layers, the final RMSNorm: hidden states (B, T, D)."""

    def __init__(self, config: PrismConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(PrismDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = PrismRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, use_cache: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                cache: Cache | None = None, **kwargs) -> BaseModelOutputWithPast | tuple:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        if kwargs.get("output_attentions"):
            raise ValueError("output_attentions is not supported: attention runs in SDPA, which keeps no weights")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled() and use_cache:
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing: setting use_cache=False")
            use_cache = False
        if use_cache and cache is None:
            cache = DynamicCache()
        if not use_cache:
            cache = None
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        B, T = x.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=x.device)[None].expand(B, T)
        rotary = {dim: rotary_tables(position_ids, dim, self.config.rope_theta, x.dtype)
                  for dim in {layer.self_attn.head_dim for layer in self.layers}}
        bias = attention_bias(attention_mask, T, past, x.dtype)
        hidden_states = []
        for layer in self.layers:
            if output_hidden_states:
                hidden_states.append(x)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = self._gradient_checkpointing_func(layer.__call__, x, rotary, bias, None)
            else:
                x = layer(x, rotary, bias, cache)
        x = self.norm(x)
        if output_hidden_states:
            hidden_states.append(x)
        out = BaseModelOutputWithPast(last_hidden_state=x, hidden_states=tuple(hidden_states) or None,
                                      **{_CACHE: cache})
        return out if return_dict is not False else out.to_tuple()


class PrismForCausalLM(PrismPreTrainedModel, GenerationMixin):
    """``PrismModel`` and the output head (tied to the embedding when ``tie_word_embeddings``)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"} if _V5 else ["lm_head.weight"]

    def __init__(self, config: PrismConfig) -> None:
        super().__init__(config)
        self.model = PrismModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, past_key_values: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, logits_to_keep: int | torch.Tensor = 0, cache: Cache | None = None,
                num_items_in_batch: int | torch.Tensor | None = None, **kwargs) -> CausalLMOutputWithPast | tuple:
        """Logits (B, T, V) (the last ``logits_to_keep`` positions when > 0); with ``labels`` (B, T), the mean
        next-token cross-entropy (labels are shifted here; -100 is ignored; a sum over ``num_items_in_batch``
        when the Trainer accumulates gradients)."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, output_hidden_states=output_hidden_states, return_dict=True, **kwargs)
        hidden = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden = hidden[:, -logits_to_keep:] if logits_to_keep > 0 else hidden
        else:  # the positions themselves
            hidden = hidden[:, logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            targets = F.pad(labels, (0, 1), value=-100)[:, 1:].to(logits.device)  # position t predicts t + 1
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                                   reduction="mean" if num_items_in_batch is None else "sum")
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch
        result = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        **{_CACHE: getattr(out, _CACHE)})
        return result if return_dict is not False else result.to_tuple()


# save_pretrained() copies this file and configuration_prism.py beside the weights only for a class registered for an
# auto class, which 4.x does not do when it loads one
PrismForCausalLM.register_for_auto_class("AutoModelForCausalLM")
