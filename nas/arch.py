"""What a shape *is*: ``ArchConfig``, ``FFNShape`` and their exact parameter and FLOP accounting.

One block of the decoder (pre-norm, LLaMA-style)::

    x = x + Attn_l(RMSNorm(x))                 # h_l heads of size d_model / h_l
    for k in 1..K:  x = x + SwiGLU_k(RMSNorm_k(x))   # each d_model -> hidden -> d_model

``K = 1`` with ``hidden ~ 8/3 * d_model`` is the conventional LLaMA FFN; ``K > 1`` with
``hidden = d_h < d_model`` is the Hourglass FFN (stacked wide-narrow-wide residual
sub-MLPs). A head schedule ``heads = (h_1, ..., h_L)`` is the Prism knob; the projections
stay ``d_model x d_model`` whatever the schedule, so parameters and FLOPs do not depend on it.
``kv_heads = (kv_1, ..., kv_L)`` is grouped-query attention (Ainslie et al. 2023, GQA): layer ``l``
keeps ``kv_l`` key/value heads (``kv_l`` divides ``h_l``; each serves ``h_l / kv_l`` query heads), so
its W_K and W_V shrink to ``kv_l d_head_l x d_model``, and so does its KV cache; empty means
``kv_l = h_l`` (multi-head attention), and an MHA shape's key, label and JSON are what they always were.

This module imports no torch: search spaces count and validate shapes without it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from nas.errors import UsageError

KV_CACHE_BYTES = 2  # bytes per cached key or value: bf16/fp16, what inference keeps (fp32 would double every figure)

# The largest shape this tool builds: far beyond any model it searches, small enough that a typo
# (--layers 10000000) is refused at once instead of allocating or enumerating for hours.
MAX_LAYERS = 4096
MAX_WIDTH = 2**17  # d_model and every hidden size
MAX_VOCAB = 2**24
MAX_K = 1024
MAX_PARAMS = 2 * 10**11


def json_kind(value: Any) -> str:
    """What a value read from JSON is, in JSON's words (``null``, ``a string``), for a user's error line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    kinds = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return next((name for kind, name in kinds.items() if isinstance(value, kind)), type(value).__name__)


def check_count(name: str, value: object, maximum: int) -> None:
    """``UsageError`` unless ``value`` is an int (not a bool) in ``[1, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}={value!r} is invalid: it must be a positive integer")
    if value > maximum:
        raise UsageError(f"{name}={value:,} is too large: at most {maximum:,}")


def divisors_up_to(n: int, limit: int) -> list[int]:
    """Divisors of ``n`` that are ``<= limit``, ascending."""
    return [h for h in range(1, min(n, limit) + 1) if n % h == 0]


def llama_ffn_hidden(d_model: int, multiple_of: int = 256) -> int:
    """LLaMA's conventional SwiGLU width: ``8/3 * d_model`` rounded up to ``multiple_of``.

    Source: LLaMA (Touvron et al. 2023), ``hidden = multiple_of * ceil(int(2/3 * 4d) / multiple_of)``.
    ``multiple_of`` is reduced for small models so the rounding never adds more than ~1/8.
    """
    raw = int(2 * 4 * d_model / 3)
    step = multiple_of
    while step > 8 and step * 8 > raw:
        step //= 2
    return step * math.ceil(raw / step)


def plateaus(heads: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of equal head count as ``(heads, length)``: ``3,3,6,6,12*8 -> [(3,2),(6,2),(12,8)]``."""
    runs: list[tuple[int, int]] = []
    for h in heads:
        if runs and runs[-1][0] == h:
            runs[-1] = (h, runs[-1][1] + 1)
        else:
            runs.append((h, 1))
    return runs


def format_plateaus(heads: Sequence[int]) -> str:
    """``"3x2,6x2,12x8"``: head count x layers, plateau by plateau."""
    return ",".join(f"{h}x{n}" for h, n in plateaus(heads))


def parse_plateaus(text: str, what: str, example: str) -> tuple[int, ...]:
    """``format_plateaus``' inverse, and plain lists: ``"3,3,6,6"`` or ``"3x2,6x2"`` (count x layers) -> one count a
    layer; ``UsageError`` naming ``what`` for an item that is no count, and for more layers than a shape may have
    (``4x99999999999999999999`` would have been a list too large to build). ``example``: a valid value to show."""
    counts: list[int] = []
    for item in text.replace(" ", "").split(","):
        count, _, times = item.partition("x")
        if not count.isdigit() or (times and not times.isdigit()):
            raise UsageError(f"{what} item {item!r} is not a count: give comma-separated integers or count x layers, "
                             f"e.g. {example}")
        repeat = int(times) if times else 1
        if repeat < 1:  # "12x0" was dropped without a word, and the rest read as the whole schedule
            raise UsageError(f"{what} item {item!r} spans 0 layers: give each count x at least 1 layer, "
                             f"e.g. {example}")
        if len(counts) + repeat > MAX_LAYERS:
            raise UsageError(f"{what} {text!r} gives more than {MAX_LAYERS:,} layers, the most a shape may have")
        counts += [int(count)] * repeat
    return tuple(counts)


@dataclass(frozen=True)
class FFNShape:
    """The FFN of every layer: ``k`` stacked residual SwiGLU sub-MLPs of hidden size ``hidden``.

    ``wider`` of the model's ``L k`` sub-MLPs (the first ones, layer by layer) have ``hidden + 1``:
    a budget can then be matched in steps of ``3 d_model`` parameters instead of ``3 L k d_model``
    (the Hourglass paper matched budgets to 0.001 %).
    """

    k: int  # number of residual sub-MLPs per layer (1 = conventional FFN)
    hidden: int  # hidden size of each sub-MLP: d_ff when k=1, the bottleneck d_h when hourglass
    wider: int = 0  # sub-MLPs (of L k, first ones first) whose hidden size is hidden + 1

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise UsageError(f"ffn.k={self.k!r} is invalid: the FFN stack depth K must be an integer >= 1")
        if isinstance(self.hidden, bool) or not isinstance(self.hidden, int) or self.hidden < 1:
            raise UsageError(f"ffn.hidden={self.hidden!r} is invalid: the SwiGLU hidden size must be an integer >= 1")
        check_count("ffn.k", self.k, MAX_K)
        check_count("ffn.hidden", self.hidden, MAX_WIDTH)
        if isinstance(self.wider, bool) or not isinstance(self.wider, int) or self.wider < 0:
            raise UsageError(f"ffn.wider={self.wider!r} is invalid: give the number of sub-MLPs with hidden + 1, "
                             ">= 0")


@dataclass(frozen=True)
class ArchConfig:
    """A decoder-only Transformer shape. Frozen, hashable, JSON round-trippable."""

    n_layers: int
    d_model: int
    heads: tuple[int, ...]  # one head count per layer; h_l must divide d_model
    ffn: FFNShape
    vocab_size: int
    tie_embeddings: bool = True  # GPT-2 ties input and output embeddings; LLaMA does not
    rope_theta: float = 10000.0  # rotary base (LLaMA 1/2)
    norm_eps: float = 1e-5  # RMSNorm epsilon (LLaMA)
    kv_heads: tuple[int, ...] = ()  # key/value heads per layer (GQA); () = one per query head, kv_l = h_l

    def __post_init__(self) -> None:
        if isinstance(self.heads, (str, bytes)) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                            for h in self.heads):
            raise UsageError(f"heads={self.heads!r} is invalid: give one integer head count per layer")
        object.__setattr__(self, "heads", tuple(self.heads))
        if isinstance(self.ffn, dict):
            object.__setattr__(self, "ffn", FFNShape(**self.ffn))
        if not isinstance(self.ffn, FFNShape):
            raise UsageError(f"ffn={self.ffn!r} is invalid: give an FFNShape or {{'k': K, 'hidden': d_h}}")
        for name, maximum in (("n_layers", MAX_LAYERS), ("d_model", MAX_WIDTH), ("vocab_size", MAX_VOCAB)):
            check_count(name, getattr(self, name), maximum)
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise UsageError(f"{name}={value!r} is invalid: it must be a positive, finite number")
        if not isinstance(self.tie_embeddings, bool):
            raise UsageError(f"tie_embeddings={self.tie_embeddings!r} is invalid: give true or false")
        if len(self.heads) != self.n_layers:
            raise UsageError(
                f"heads has {len(self.heads)} entries but n_layers={self.n_layers}: give one head count per layer"
            )
        if self.ffn.wider >= self.n_layers * self.ffn.k:
            raise UsageError(f"ffn.wider={self.ffn.wider} is invalid: the model has {self.n_layers * self.ffn.k} "
                             "sub-MLPs; give fewer (hidden + 1 in all of them is hidden + 1)")
        for layer, h in enumerate(self.heads, start=1):
            if h < 1 or self.d_model % h:
                limit = min(max(self.heads), self.d_model)
                valid = ",".join(map(str, divisors_up_to(self.d_model, limit)))
                raise UsageError(
                    f"heads[layer {layer}]={h} does not divide d_model={self.d_model}; "
                    f"divisors <= {limit} are {valid}"
                )
        self._check_kv_heads()
        total = self.n_params()["total"]
        if total > MAX_PARAMS:
            raise UsageError(f"this shape has {total:,} parameters: at most {MAX_PARAMS:,}")

    def _check_kv_heads(self) -> None:
        """``kv_heads``: () or one count per layer dividing that layer's heads; stored as () when it equals ``heads``
        (multi-head attention), so an MHA shape equals, keys and serialises as it did before GQA existed."""
        kv = self.kv_heads
        if isinstance(kv, (str, bytes)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in kv):
            raise UsageError(f"kv_heads={kv!r} is invalid: give one integer key/value head count per layer")
        kv = tuple(kv)
        if kv and len(kv) != self.n_layers:
            raise UsageError(f"kv_heads has {len(kv)} entries but n_layers={self.n_layers}: give one key/value head "
                             "count per layer")
        for layer, (h, n) in enumerate(zip(self.heads, kv), start=1):
            if n < 1 or h % n:
                valid = ",".join(map(str, divisors_up_to(h, h)))
                raise UsageError(f"kv_heads[layer {layer}]={n} does not divide that layer's {h} heads; "
                                 f"valid key/value head counts are {valid}")
        object.__setattr__(self, "kv_heads", () if kv == self.heads else kv)

    # ----------------------------------------------------------------- accounting
    @property
    def grouped(self) -> bool:
        """Whether some layer shares key/value heads among query heads (GQA or MQA)."""
        return bool(self.kv_heads)

    def kv_per_layer(self) -> tuple[int, ...]:
        """``kv_l`` per layer: ``kv_heads``, or ``heads`` for multi-head attention."""
        return self.kv_heads or self.heads

    def kv_groups(self) -> tuple[int, ...]:
        """``h_l / kv_l`` per layer: query heads per key/value head (1 = multi-head, ``h_l`` = multi-query)."""
        return tuple(h // n for h, n in zip(self.heads, self.kv_per_layer()))

    def kv_cache_bytes_per_token(self, bytes_per_value: int = KV_CACHE_BYTES) -> int:
        """Bytes of KV cache one token of context costs at inference: ``2 sum_l kv_l d_head_l bytes`` (a key and a
        value vector of ``d_head_l`` per key/value head and layer)."""
        return 2 * sum(n * (self.d_model // h) for h, n in zip(self.heads, self.kv_per_layer())) * bytes_per_value

    def sub_mlp_hidden(self, layer: int, index: int) -> int:
        """Hidden size of sub-MLP ``index`` (0-based) of layer ``layer`` (0-based)."""
        return self.ffn.hidden + (layer * self.ffn.k + index < self.ffn.wider)

    def head_dims(self) -> tuple[int, ...]:
        """``d_model / h_l`` per layer."""
        return tuple(self.d_model // h for h in self.heads)

    def n_params(self) -> dict[str, int]:
        """Exact parameter count by part; equals ``sum(p.numel())`` of ``nas.model.Transformer``.

        - embedding: ``V d`` (token table) ``+ V d`` for an untied output head
        - attention: ``sum_l (2 d^2 + 2 d kv_l d_head_l)`` (W_Q, W_O ``d x d``; W_K, W_V ``kv_l d_head_l x d``; no
          biases): ``L * 4 d^2`` for multi-head attention, whatever the head schedule
        - ffn: ``3 d (L K d_h + wider)`` (SwiGLU gate, up and down projections; ``wider`` sub-MLPs have d_h + 1)
        - norm: ``L (1 + K) d + d`` (one RMSNorm gain before attention, one per sub-MLP, one final)
        """
        d, L, V = self.d_model, self.n_layers, self.vocab_size
        k, hidden = self.ffn.k, self.ffn.hidden
        parts = {
            "embedding": V * d * (1 if self.tie_embeddings else 2),
            "attention": sum(2 * d * d + 2 * d * n * (d // h) for h, n in zip(self.heads, self.kv_per_layer())),
            "ffn": 3 * d * (L * k * hidden + self.ffn.wider),
            "norm": L * (1 + k) * d + d,
        }
        parts["total"] = sum(parts.values())
        parts["non_embedding"] = parts["total"] - parts["embedding"]
        return parts

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward), the nanoGPT / PaLM (Chowdhery et al. 2022, App. B) convention.

        ``6 N_matmul + sum_l 12 * h_l * (d / h_l) * T`` where ``N_matmul`` counts the weights
        used in matmuls (attention, FFN and the output head ``V d``; not the embedding lookup
        nor the norm gains) and the second term is attention's ``QK^T`` and ``AV`` (2 matmuls
        x 2 FLOPs x 3 for forward + backward) over a context of ``T`` tokens, summed per layer
        with each layer's own head count (``h_l * d_head_l = d``, so the schedule cancels). Grouped key/value
        heads shrink ``N_matmul`` (W_K, W_V) but not this term: every query head still scores every key.
        """
        p = self.n_params()
        n_matmul = p["attention"] + p["ffn"] + self.vocab_size * self.d_model
        attention = sum(12 * h * (self.d_model // h) * seq_len for h in self.heads)
        return 6 * n_matmul + attention

    # ----------------------------------------------------------------- identity & I/O
    def key(self) -> str:
        """Canonical string: two configs train the same model iff their keys are equal."""
        heads = ",".join(map(str, self.heads))
        kv = f"-kv[{','.join(map(str, self.kv_heads))}]" if self.kv_heads else ""  # only GQA shapes: MHA keys unchanged
        tie = "tied" if self.tie_embeddings else "untied"
        return (
            f"L{self.n_layers}-d{self.d_model}-h[{heads}]{kv}-K{self.ffn.k}x{self._ffn_text()}"
            f"-V{self.vocab_size}-{tie}-rope{self.rope_theta:g}-eps{self.norm_eps:g}"
        )

    def label(self) -> str:
        """Short human description for progress lines and tables: ``h=3x2,6x2,12x8 K1x256 d96 L12``, with the
        key/value heads after the heads when they are grouped: ``h=12x12 kv=4x6,2x6 K1x268+4 d96 L12``."""
        kv = f" kv={format_plateaus(self.kv_heads)}" if self.kv_heads else ""
        return (f"h={format_plateaus(self.heads)}{kv} K{self.ffn.k}x{self._ffn_text()} d{self.d_model} "
                f"L{self.n_layers}")

    def _ffn_text(self) -> str:
        """``256``, or ``24+7`` when 7 sub-MLPs have 25."""
        return f"{self.ffn.hidden}+{self.ffn.wider}" if self.ffn.wider else str(self.ffn.hidden)

    def summary(self) -> dict[str, Any]:
        """Flat description for tables and Optuna user attrs (the report's axes included)."""
        p = self.n_params()
        return {
            "layers": self.n_layers,
            "d_model": self.d_model,
            "heads": list(self.heads),
            "kv_heads": list(self.kv_per_layer()),
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token(),
            "k": self.ffn.k,
            "d_h": self.ffn.hidden,
            "vocab_size": self.vocab_size,
            "tie_embeddings": self.tie_embeddings,
            "d_model_per_layer": self.d_model / self.n_layers,
            "d_h_over_d_model": (self.ffn.hidden + self.ffn.wider / (self.n_layers * self.ffn.k)) / self.d_model,
            "params": p["total"],
            "params_attention": p["attention"],
            "params_ffn": p["ffn"],
            "params_embedding": p["embedding"],
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["heads"] = list(self.heads)
        if self.kv_heads:
            data["kv_heads"] = list(self.kv_heads)
        else:  # the dict of a multi-head shape is the one it always was
            del data["kv_heads"]
        if not self.ffn.wider:  # the dict of a shape without wider sub-MLPs is the one it always was
            del data["ffn"]["wider"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArchConfig:
        known = {"n_layers", "d_model", "heads", "ffn", "vocab_size", "tie_embeddings", "rope_theta", "norm_eps",
                 "kv_heads"}
        if not isinstance(data, dict):
            raise UsageError(f"an ArchConfig is a JSON object, not {json_kind(data)}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown ArchConfig field(s) {', '.join(unknown)}; "
                             f"valid fields are {', '.join(sorted(known))}")
        data = dict(data)
        missing = sorted({"n_layers", "d_model", "heads", "ffn", "vocab_size"} - set(data))
        if missing:
            raise UsageError(f"ArchConfig field(s) {', '.join(missing)} missing")
        ffn = data.get("ffn")
        if isinstance(ffn, dict):
            extra = sorted(set(ffn) - {"k", "hidden", "wider"})
            if extra or not {"k", "hidden"} <= set(ffn):
                raise UsageError(f"ffn={ffn!r} is invalid: give {{'k': K, 'hidden': d_h}} (and 'wider')")
            data["ffn"] = FFNShape(**ffn)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> ArchConfig:
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> ArchConfig:
        """This shape with ``changes``. New ``heads`` without new ``kv_heads`` keep each layer's group size
        ``h_l / kv_l`` (a ``UsageError`` where it does not divide the new count)."""
        data = self.to_dict()
        if "heads" in changes and "kv_heads" not in changes and self.kv_heads:
            heads = list(changes["heads"])
            groups = self.kv_groups()
            if len(heads) != len(groups) or any(h % g for h, g in zip(heads, groups)):
                raise UsageError(f"heads {format_plateaus(heads)} cannot keep the group sizes "
                                 f"{format_plateaus(groups)} of kv_heads {format_plateaus(self.kv_heads)}: "
                                 "give kv_heads")
            data["kv_heads"] = [h // g for h, g in zip(heads, groups)]
        data.update(changes)
        return ArchConfig.from_dict(data)


def uniform(n_layers: int, d_model: int, n_heads: int, vocab_size: int, ffn: FFNShape | None = None,
            tie_embeddings: bool = True) -> ArchConfig:
    """The conventional shape: ``n_heads`` in every layer and, by default, the LLaMA FFN."""
    return ArchConfig(
        n_layers=n_layers,
        d_model=d_model,
        heads=(n_heads,) * n_layers,
        ffn=ffn or FFNShape(k=1, hidden=llama_ffn_hidden(d_model)),
        vocab_size=vocab_size,
        tie_embeddings=tie_embeddings,
    )
