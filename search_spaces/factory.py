"""Build a search space from user options: the one place that fills defaults and rejects bad values.

Every option is None when the user did not give it; ``defaults`` (a baseline ``ArchConfig``,
e.g. a proxy preset's) fills the shape, else ``DEFAULT_BASELINE``. Bad values raise one-line
``UsageError``s naming the value and what would be valid.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from nas.arch import MAX_WIDTH, ArchConfig, FFNShape, llama_ffn_hidden, uniform
from nas.errors import UsageError
from search_spaces.base import SearchSpace, check_heads, heads_error
from search_spaces.grouped import KVScheduleSpace, UniformGroupPrismSpace
from search_spaces.hourglass import HourglassSpace
from search_spaces.joint import JointSpace
from search_spaces.kv import KVRule
from search_spaces.prism import PrismSpace

# The CPU proxy's shape: GPT-2 small's depth and head count (12 x 12) at an eighth of its width (head counts 1, 2,
# 3, 4, 6, 8, 12 all divide 96), byte-level vocabulary, tied embeddings, conventional LLaMA FFN (hidden 256).
DEFAULT_BASELINE = uniform(n_layers=12, d_model=96, n_heads=12, vocab_size=256)

SPACES = ("prism", "hourglass", "joint")
PRISM_ONLY = ("min_plateau", "max_plateau", "min_baseline", "hw_aligned", "min_head_dim", "max_head_dim")
HOURGLASS_ONLY = ("budget", "k_values", "layer_values", "ratio_values", "head_dim", "tolerance",
                  "ratio_tolerance", "fix", "hidden_multiple")
KV_OPTIONS = ("kv_groups", "kv_schedule", "min_kv_heads", "kv_min_plateau", "kv_max_plateau")  # every space


@dataclass(frozen=True)
class SpaceOptions:
    """Every shape option of ``nas space`` and ``nas search``; None means "the default"."""

    space: str = "prism"  # prism | hourglass | joint
    # the baseline shape (defaults: the ``defaults`` ArchConfig, else DEFAULT_BASELINE)
    layers: int | None = None
    d_model: int | None = None
    heads: int | None = None  # h_base: the uniform head count, must divide d_model
    vocab: int | None = None
    tie_embeddings: bool | None = None
    ffn_hidden: int | None = None  # the conventional FFN's hidden size (LLaMA's ~8/3 d_model)
    # prism (also joint)
    min_plateau: int | None = None  # 2
    max_plateau: int | None = None  # 4
    min_baseline: int | None = None  # ceil(L/2)
    hw_aligned: bool | None = None  # False
    min_head_dim: int | None = None
    max_head_dim: int | None = None  # none (the GPU presets: 256, FlashAttention's largest)
    # hourglass (also joint)
    budget: int | None = None  # parameters; None: the baseline shape's count
    k_values: tuple[int, ...] | None = None  # (1, 2, 4, 6, 8)
    layer_values: tuple[int, ...] | None = None  # L/2, 3L/4, L, 3L/2, 2L
    ratio_values: tuple[float, ...] | None = None  # d_h/d_model: 0.2 ... 1.0
    head_dim: int | None = None  # the baseline's d_model / heads
    tolerance: float | None = None  # 0.001 = 0.1% of the budget
    ratio_tolerance: float | None = None  # 0.15: achieved d_h/d_model within ±15% of the grid value
    fix: str | None = None  # "attention": keep the baseline's d_model and L
    hidden_multiple: int | None = None  # d_h a multiple of this (64 for GPU presets); None: exact budgets
    # grouped-query attention (every space; search_spaces.kv): None and None is the space without it
    kv_groups: tuple[int, ...] | None = None  # group sizes h_l / kv_l besides 1; alone: one per member, every layer
    kv_schedule: bool | None = None  # a non-decreasing group size per layer (default groups: divisors of h_base)
    min_kv_heads: int | None = None  # 1: a grouped layer keeps at least this many key/value heads
    kv_min_plateau: int | None = None  # 2: the shortest plateau of one group size
    kv_max_plateau: int | None = None  # 4: the longest, the deepest plateau excepted


def _given(opts: SpaceOptions, names: tuple[str, ...]) -> list[str]:
    # `is`, not `in`: 0 == False, and --kv-max-plateau 0 is a value given (and a bad one)
    return ["--" + n.replace("_", "-") for n in names if getattr(opts, n) is not None and getattr(opts, n) is not False]


def _kwargs(opts: SpaceOptions, names: tuple[str, ...]) -> dict[str, object]:
    """The options in ``names`` that were given; the space's own defaults cover the rest."""
    return {n: getattr(opts, n) for n in names if getattr(opts, n) is not None}


def build_space(opts: SpaceOptions, defaults: ArchConfig | None = None) -> SearchSpace:
    """The search space the options describe; raises ``UsageError`` for any bad or misplaced value."""
    if opts.space not in SPACES:
        raise UsageError(f"unknown space {opts.space!r}; choose prism, hourglass or joint")
    foreign = _given(opts, HOURGLASS_ONLY if opts.space == "prism" else PRISM_ONLY if opts.space == "hourglass" else ())
    if foreign:
        owner = "hourglass and joint" if opts.space == "prism" else "prism and joint"
        raise UsageError(f"{', '.join(foreign)} only appl{'ies' if len(foreign) == 1 else 'y'} to the {owner} "
                         f"spaces, not {opts.space}")
    base = defaults or DEFAULT_BASELINE
    layers = base.n_layers if opts.layers is None else opts.layers
    d_model = base.d_model if opts.d_model is None else opts.d_model
    heads = base.heads[-1] if opts.heads is None else opts.heads
    vocab = base.vocab_size if opts.vocab is None else opts.vocab
    tie = base.tie_embeddings if opts.tie_embeddings is None else opts.tie_embeddings
    if not isinstance(d_model, int) or d_model < 1:
        raise UsageError(f"d_model={d_model!r} is invalid: it must be a positive integer")
    if d_model > MAX_WIDTH:  # before the FFN derived from it is refused under its own name
        raise UsageError(f"d_model={d_model:,} is too large: at most {MAX_WIDTH:,}")
    if opts.heads is None and (reason := heads_error(heads, d_model)) is not None:  # say where the count came from
        raise UsageError(f"{reason} (--heads not given: {heads} is the baseline's head count; give --heads)")
    check_heads(heads, d_model)
    # the defaults' FFN only fits their own width
    ffn = base.ffn if d_model == base.d_model else FFNShape(1, llama_ffn_hidden(d_model))
    if opts.ffn_hidden is not None:
        ffn = FFNShape(ffn.k, opts.ffn_hidden)
    rule = kv_rule(opts, heads)
    prism_kwargs = _kwargs(opts, PRISM_ONLY)
    if opts.space == "prism":
        prism = PrismSpace(layers, d_model, heads, vocab_size=vocab, tie_embeddings=tie, ffn=ffn, **prism_kwargs)
        if rule is None:
            return prism
        return KVScheduleSpace(prism, rule) if rule.schedule else UniformGroupPrismSpace(prism, rule)
    if ffn.k != 1:
        raise UsageError(f"the hourglass baseline needs a conventional FFN (K=1), not K={ffn.k}")
    grid = {"kv_groups": rule.groups, "min_kv_heads": rule.min_kv_heads} if rule and not rule.schedule else {}
    hourglass = HourglassSpace(layers, d_model, heads, vocab_size=vocab, tie_embeddings=tie, ffn_hidden=ffn.hidden,
                               **_kwargs(opts, HOURGLASS_ONLY), **grid)
    space: HourglassSpace | JointSpace = hourglass if opts.space == "hourglass" else JointSpace(hourglass,
                                                                                              **prism_kwargs)
    if rule is not None and rule.schedule:
        return KVScheduleSpace(space, rule, hourglass.hidden_multiple)
    return space


def kv_rule(opts: SpaceOptions, h_base: int) -> KVRule | None:
    """The grouped-query rule the options give (``search_spaces.kv``), None without GQA options; one-line errors for
    options that need another, group sizes the baseline's ``h_base`` heads cannot take."""
    if opts.kv_groups is None and not opts.kv_schedule:
        stray = _given(opts, KV_OPTIONS)
        if stray:
            raise UsageError(f"{', '.join(stray)} appl{'ies' if len(stray) == 1 else 'y'} with --kv-groups or "
                             "--kv-schedule")
        return None
    if not opts.kv_schedule and (stray := _given(opts, ("kv_min_plateau", "kv_max_plateau"))):
        raise UsageError(f"{', '.join(stray)} appl{'ies' if len(stray) == 1 else 'y'} with --kv-schedule")
    rule = KVRule.build(h_base, opts.kv_groups, bool(opts.kv_schedule), opts.min_kv_heads, opts.kv_min_plateau,
                        opts.kv_max_plateau)
    if rule.groups == (1,) and opts.kv_groups is None and opts.min_kv_heads is not None and h_base > 1:
        smallest = next(g for g in range(2, h_base + 1) if h_base % g == 0)  # the group size keeping most KV heads
        raise UsageError(f"--min-kv-heads {opts.min_kv_heads} leaves no group size above 1: sharing among "
                         f"{smallest} of the baseline's {h_base} heads already keeps only {h_base // smallest}; give "
                         f"--min-kv-heads from 1 to {h_base // smallest}")
    if rule.groups == (1,):
        raise UsageError("group size 1 alone is multi-head attention, the space without --kv-groups: give group "
                         f"sizes above 1 that divide the baseline's {h_base} heads"
                         if h_base > 1 else "the baseline has 1 head: no key/value heads to share")
    return rule


OPTION_NAMES = tuple(f.name for f in fields(SpaceOptions))
