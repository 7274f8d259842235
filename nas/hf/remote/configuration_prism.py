"""Configuration of a Prism / Hourglass decoder exported by prism-nas (``model_type: prism``).

A LLaMA-style decoder whose shape varies by layer:

- ``num_attention_heads[l]`` heads in layer ``l`` (the Prism schedule), each of size
  ``hidden_size / num_attention_heads[l]``; ``num_key_value_heads[l]`` key/value heads, dividing it
  (grouped-query attention; equal to the head counts when every head has its own keys and values);
- ``ffn_num_mlps`` (K) stacked residual SwiGLU sub-MLPs per layer (the Hourglass FFN; K = 1 is the
  conventional FFN), each with its own RMSNorm and hidden size ``intermediate_size``, except the
  first ``ffn_wider`` sub-MLPs of the model (layer by layer), which have ``intermediate_size + 1``.

This file depends on ``transformers`` only: it travels with the model directory.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class PrismConfig(PretrainedConfig):
    model_type = "prism"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 64,
        num_hidden_layers: int = 2,
        num_attention_heads: int | list[int] = 4,  # an int: the same count in every layer
        num_key_value_heads: int | list[int] | None = None,  # None: one per attention head
        ffn_num_mlps: int = 1,
        intermediate_size: int = 176,
        ffn_wider: int = 0,
        rms_norm_eps: float = 1e-5,
        rope_theta: float = 10000.0,
        max_position_embeddings: int = 2048,  # the context it was trained at; RoPE itself has no limit
        initializer_range: float = 0.02,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = _per_layer(num_attention_heads, num_hidden_layers, "num_attention_heads")
        kv = self.num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.num_key_value_heads = _per_layer(kv, num_hidden_layers, "num_key_value_heads")
        self.ffn_num_mlps = ffn_num_mlps
        self.intermediate_size = intermediate_size
        self.ffn_wider = ffn_wider
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.hidden_act = "silu"
        for layer, (h, kv) in enumerate(zip(self.num_attention_heads, self.num_key_value_heads)):
            if h < 1 or hidden_size % h:
                raise ValueError(f"num_attention_heads[{layer}]={h} does not divide hidden_size={hidden_size}")
            if kv < 1 or h % kv:
                raise ValueError(f"num_key_value_heads[{layer}]={kv} does not divide num_attention_heads[{layer}]={h}")
        if ffn_num_mlps < 1 or intermediate_size < 1 or not 0 <= ffn_wider < num_hidden_layers * ffn_num_mlps:
            raise ValueError(f"ffn_num_mlps={ffn_num_mlps}, intermediate_size={intermediate_size}, "
                             f"ffn_wider={ffn_wider}: give K >= 1, a size >= 1 and 0 <= wider < layers x K")
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    def head_dim(self, layer: int) -> int:
        return self.hidden_size // self.num_attention_heads[layer]

    def mlp_size(self, layer: int, index: int) -> int:
        """Hidden size of sub-MLP ``index`` of layer ``layer`` (both 0-based)."""
        return self.intermediate_size + (layer * self.ffn_num_mlps + index < self.ffn_wider)


def _per_layer(value: int | list[int], layers: int, name: str) -> list[int]:
    counts = [int(value)] * layers if isinstance(value, int) else [int(v) for v in value]
    if len(counts) != layers:
        raise ValueError(f"{name} has {len(counts)} entries for {layers} layers: give one per layer")
    return counts
