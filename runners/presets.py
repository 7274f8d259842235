"""Named proxy and target setups: a baseline shape (what the search space is built around) plus a ``TrainConfig``.

``cpu`` (the default) is sized so that ``nas search --space prism --trials 200`` fits in
well under half an hour on 2 CPU cores (README, "Choosing the proxy", has the timings):
GPT-2 small's *structure* (12 layers, 12 baseline heads, hence the Prism paper's 129-schedule
space) at width 96 (the largest width below 192 that keeps every head count 1, 2, 3, 4, 6, 8, 12
a divisor), byte-level vocabulary, context 128, 32k training tokens per trial; validation loss
falls from ln 256 = 5.55 to about 2.9 nats/byte. ``cpu-long`` trains 8x longer for rankings
that must resolve finer differences. The ``gpt2-*``,
``prism-757m`` and ``hourglass-113m`` presets are the papers' real scales, for GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nas.arch import ArchConfig, FFNShape, uniform
from nas.errors import UsageError
from runners.config import TrainConfig
from search_spaces.factory import HOURGLASS_ONLY, PRISM_ONLY, SpaceOptions


@dataclass(frozen=True)
class GpuEstimate:
    """What a GPU proxy preset's trial costs, from ``ArchConfig.flops_per_token`` and stated assumptions.

    ``minutes per trial = (tokens * flops_per_token(T) / achieved_flops + compile_s) / 60`` with
    ``achieved_flops = peak_flops * mfu``. The peak is the dense bf16 tensor-core figure of an H100/H200 SXM
    (989 TFLOP/s, NVIDIA's datasheet); ``mfu`` and ``compile_s`` are measured by ``benchmarks/gpu_check.py``
    on one NVIDIA H200 (torch 2.11, CUDA 13.0; ``benchmarks/data/gpu_check-nvidia-h200.json``): GPT-2 small's
    uniform shape at the GPU presets' batch (32 x 1024, bf16, fused AdamW, ``torch.compile``) trained at
    500,534 tokens/s, 428 TFLOP/s achieved, 0.433 of the datasheet peak (0.554 of the 772 TFLOP/s bf16 matmul
    peak it measured there; nanoGPT and modded-nanogpt report 0.3-0.5 at this scale). A run's MFU is against
    that measured peak (``runners.peak``), so it reads higher for the same speed; ``run_mfu`` converts.
    ``compile_s``: each trial is a new schedule, compiled cold (``runners.proxy.compile_model`` empties
    Dynamo's caches): 54.6-57.4 s a schedule there (Dynamo, AOT autograd and Inductor's Triton code on 4
    compile threads), the slowest taken. That figure holds two compiles: the RoPE tables grew inside the first
    call and the second compiled the forward again, which ``compile_model`` now avoids; until gpu_check
    measures it again, the estimate keeps the higher figure. ``seed_sd`` is the full-scale seed noise the
    resolution estimate starts from: modded-nanogpt's repeated GPT-2 small runs reported a standard deviation of
    about 0.002 nats of the final validation loss. A 100M-token trial is shorter and likely noisier: measure it
    with ``benchmarks/proxy_fidelity.py`` on the GPU before trusting the estimate.
    """

    peak_flops: float = 989e12
    mfu: float = 0.43
    compile_s: float = 57.0
    seed_sd: float = 0.002

    @property
    def achieved_flops(self) -> float:
        return self.peak_flops * self.mfu

    def run_mfu(self, measured_peak: float) -> float:
        """The MFU a run would print at this estimate's speed: against the matmul peak it measured."""
        return self.achieved_flops / measured_peak

    def tokens_per_s(self, arch: ArchConfig, train: TrainConfig) -> float:
        return self.achieved_flops / arch.flops_per_token(train.seq_len)

    def minutes_per_trial(self, arch: ArchConfig, train: TrainConfig) -> float:
        return (train.tokens / self.tokens_per_s(arch, train) + self.compile_s) / 60


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    baseline: ArchConfig  # the uniform-head, conventional-FFN shape the spaces are built around
    train: TrainConfig
    gpu: GpuEstimate | None = None  # for GPU proxy presets: what a trial costs (``nas presets`` prints it)
    space: tuple[tuple[str, Any], ...] = ()  # space options this preset sets when the command line does not

    def space_options(self, opts: SpaceOptions) -> SpaceOptions:
        """``opts`` with this preset's space defaults filled in where the user gave none (and where the space
        takes the option: a Prism option is not given to the hourglass space)."""
        foreign = HOURGLASS_ONLY if opts.space == "prism" else PRISM_ONLY if opts.space == "hourglass" else ()
        filled = {k: v for k, v in self.space if k not in foreign and getattr(opts, k) is None}
        return replace(opts, **filled) if filled else opts


_CPU_TRAIN = TrainConfig(tokens=32_768, batch_size=4, seq_len=128, lr=1e-2, warmup_frac=0.05,
                         eval_every=8_192, eval_tokens=1_024, prune_eval_tokens=512, attention_batches=1,
                         ema_decay=0.9)  # scored on a weight average: benchmarks figure 11
_GPU_TRAIN = TrainConfig(batch_size=32, seq_len=1024, lr=6e-4, warmup_frac=0.02, eval_every=5_242_880,
                         eval_tokens=1_048_576, attention_batches=2, device="cuda", dtype="bf16", weight_decay=0.1)
# a search's trial on one GPU: 100M tokens (minutes at GPT-2 small scale), five pruning points, compiled
_GPU_PROXY_TRAIN = _GPU_TRAIN.with_(tokens=100_000_000, eval_every=20_971_520, prune_eval_tokens=262_144,
                                    warmup_frac=0.05, lr=1.5e-3, compile=True)
# head dims above 256 (1 or 2 heads at d768) get no FlashAttention kernel: SDPA falls back to the memory-efficient
# one (runners.device.sdpa_kernel), and tokens/s would differ for kernel reasons, not the schedule's; keeping them out
# leaves 53 of the 129 Prism schedules (--max-head-dim 768 keeps all)
_GPU_SPACE = (("max_head_dim", 256),)

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("cpu", "GPT-2 small structure (12 layers x 12 heads) at width 96, bytes, 32,768 tokens/trial: "
           "200 trials in 5.3 min on a 2-core machine with a 440-445 GFLOP/s fp32 peak (2 workers)",
           uniform(12, 96, 12, 256), _CPU_TRAIN),
    # lr 3e-3: at 6e-3 some seeds sat on the unigram plateau (~3.2 nats) for most of the run, and two seeds of one
    # shape ended 2.36 and 2.93; at 3e-3 the same two ended 2.10 and 2.19 (benchmarks/reference_panel.py)
    Preset("cpu-long", "the cpu shape trained 8x longer (262,144 tokens/trial, lr 3e-3): the reference panel's setup",
           uniform(12, 96, 12, 256), _CPU_TRAIN.with_(tokens=262_144, eval_every=65_536, lr=3e-3)),
    # the cheapest CPU proxy that ranks the width-depth-FFN axis: one seed at 4x the tokens agrees with the Hourglass
    # reference panel at Kendall tau +0.67 [+0.57, +0.78], where 8 seeds of `cpu` (twice the CPU) reach +0.60
    # [+0.29, +0.65] (benchmarks/proxy_fidelity.py --space hourglass); lr 8e-3: the 4x trials' tuned rate
    Preset("cpu-hourglass", "the cpu shape at 4x the tokens (131,072 tokens/trial, lr 8e-3): the cheapest CPU proxy "
           "that ranks the Hourglass axis (Kendall tau +0.67 against its reference panel at one seed a shape)",
           uniform(12, 96, 12, 256), _CPU_TRAIN.with_(tokens=131_072, eval_every=16_384, lr=8e-3)),
    Preset("gpu-prism", "GPT-2 small's structure (L12 d768 h12, V50304, SwiGLU 2048: 53 of the 129 Prism "
           "schedules, head dims <= 256) as a GPU proxy: 100M tokens/trial, bf16, compiled; FineWeb .bin shards "
           "via --data",
           uniform(12, 768, 12, 50304, FFNShape(1, 2048)), _GPU_PROXY_TRAIN, GpuEstimate(), _GPU_SPACE),
    Preset("gpu-hourglass", "the Hourglass paper's 113M LLaMA-style base (L12 d768 h12, V32000, SwiGLU 2176) as "
           "a GPU proxy: 100M tokens/trial, bf16, compiled",
           uniform(12, 768, 12, 32000, FFNShape(1, 2176)), _GPU_PROXY_TRAIN, GpuEstimate(), _GPU_SPACE),
    Preset("tiny", "4 layers x 4 heads at width 32, 4,096 tokens: seconds per trial, for tests and smoke runs",
           uniform(4, 32, 4, 256), TrainConfig(tokens=4_096, batch_size=4, seq_len=32, lr=1e-2,
                                               eval_every=1_024, eval_tokens=512, attention_batches=1)),
    Preset("gpt2-124m", "GPT-2 small (L12 d768 h12, V50304 tied, SwiGLU 2048), 1B tokens, context 1024",
           uniform(12, 768, 12, 50304, FFNShape(1, 2048)), _GPU_TRAIN.with_(tokens=1_000_000_000)),
    Preset("gpt2-354m", "GPT-2 medium (L24 d1024 h16, SwiGLU 2816), 3B tokens",
           uniform(24, 1024, 16, 50304, FFNShape(1, 2816)), _GPU_TRAIN.with_(tokens=3_000_000_000, lr=3e-4)),
    Preset("prism-757m", "GPT-2 large-like (L36 d1280 h20, SwiGLU 3456), 6B tokens",
           uniform(36, 1280, 20, 50304, FFNShape(1, 3456)), _GPU_TRAIN.with_(tokens=6_000_000_000, lr=2.5e-4)),
    Preset("hourglass-113m", "LLaMA-style 113M (L12 d768 h12, V32000 tied, SwiGLU 2176), 2B tokens",
           uniform(12, 768, 12, 32000, FFNShape(1, 2176)), _GPU_TRAIN.with_(tokens=2_000_000_000)),
)}
# grouped-query attention on the joint space (search_spaces.kv): group sizes 2 and 4 (Llama 3 shares each key/value
# head among 4 query heads) and 12 (multi-query), 1 (multi-head) always among them; at the Hourglass paper's 113M base
# the Hourglass grid keeps 472 members (223 multi-head, 140 at g=2, 79 at g=4, 30 at g=12: the width must be a
# multiple of 64 g), their Prism schedules 7,817 (5,761 without GQA); the KV cache is 36,864 bytes a token (12 layers
# x 768 keys and values x 2 bytes) at the baseline, 18,432 at g=2, 9,216 at g=4 and 3,072 multi-query
_GPU_GQA_SPACE = (*_GPU_SPACE, ("kv_groups", (2, 4, 12)))
PRESETS["gpu-joint-gqa"] = Preset(
    "gpu-joint-gqa", "the Hourglass paper's 113M base (L12 d768 h12, V32000, SwiGLU 2176) with grouped-query "
    "attention as a GPU proxy: the joint space at group sizes 1, 2, 4, 12 (7,817 members, head dims <= 256; 5,761 "
    "without GQA), KV cache 36,864 bytes/token at the baseline, 9,216 at g=4, 3,072 multi-query; 100M tokens/trial, "
    "bf16, compiled; search with --objectives loss,kv_cache",
    uniform(12, 768, 12, 32000, FFNShape(1, 2176)), _GPU_PROXY_TRAIN, GpuEstimate(), _GPU_GQA_SPACE)
DEFAULT_PRESET = "cpu"


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
