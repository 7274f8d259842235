"""``TrainConfig``: everything about a training run that is not the shape itself."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from nas.errors import UsageError

MAX_TOKENS = 10**13  # far beyond any run: a typo is refused instead of planned
RUN_ONLY_FIELDS = ("threads", "device", "compile", "micro_batch")  # how a run executes, not what it computes
# set in the environment of a `nas train` that `nas rerun` launched: the launcher printed the whole-steps note once
STEPS_NOTE_SHOWN = "NAS_STEPS_NOTE_SHOWN"


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Every trial of a study shares it, so trials differ only by shape (and seed)."""

    tokens: int = 65_536  # training token budget: the same for every trial (fair comparison)
    batch_size: int = 8  # sequences per optimiser step
    seq_len: int = 128  # context length T
    lr: float = 3e-3  # peak AdamW learning rate (small proxies tolerate a high one)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_frac: float = 0.1  # share of steps spent in linear warmup
    weight_decay: float = 0.1  # AdamW, on matrices only (not on norm gains)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # global gradient-norm clip
    eval_every: int = 16_384  # tokens between validation evaluations (pruning points)
    eval_tokens: int = 8_192  # validation tokens of the final evaluation (the score): fixed windows, spread
    prune_eval_tokens: int = 0  # validation tokens of the intermediate evaluations (pruning points); 0 = eval_tokens
    attention_batches: int = 1  # validation batches used for the per-layer attention distance
    diverge_factor: float = 2.0  # diverged when the train loss exceeds this multiple of its first value
    ema_decay: float = 0.0  # > 0: the score is measured on an exponential moving average of the weights
    score_evals: int = 1  # > 1: the score is the mean of this many full evaluations over the last quarter of training
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "fp32"  # fp32 | bf16 (autocast on CUDA)
    compile: bool = False  # torch.compile: ~30 s cold on CPU for ~9 % speed, so off for CPU proxies
    threads: int = 0  # torch intra-op threads; 0 = the cores this process may use
    micro_batch: int = 0  # sequences per forward (gradients accumulated over the batch); 0 = the whole batch

    def __post_init__(self) -> None:
        limits = {"tokens": MAX_TOKENS, "batch_size": 2**16, "seq_len": 2**20, "eval_every": MAX_TOKENS,
                  "eval_tokens": MAX_TOKENS}
        for name, maximum in limits.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name}={value!r} is invalid: it must be a positive integer")
            if value > maximum:
                raise UsageError(f"{name}={value:,} is too large: at most {maximum:,}")
        for name, maximum in (("threads", 4096), ("prune_eval_tokens", MAX_TOKENS), ("attention_batches", 2**16)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
                raise UsageError(f"{name}={value!r} is invalid: give 0 or a positive integer up to {maximum:,}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise UsageError(f"seed={self.seed!r} is invalid: give an integer in [0, 2^32)")
        for name in ("lr", "grad_clip", "diverge_factor", "weight_decay", "min_lr_ratio", "beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UsageError(f"{name}={value!r} is invalid: it must be a finite number")
        if self.lr <= 0:
            raise UsageError(f"lr={self.lr} is invalid: it must be positive")
        if self.tokens < self.tokens_per_step:
            raise UsageError(f"tokens={self.tokens:,} is less than one step of {self.batch_size} x {self.seq_len} = "
                             f"{self.tokens_per_step:,} tokens")
        if not 0 <= self.warmup_frac < 1:
            raise UsageError(f"warmup_frac={self.warmup_frac} is invalid: use a value in [0, 1)")
        if self.device not in ("auto", "cpu", "cuda", "mps") and not (
                self.device.startswith("cuda:") and self.device[5:].isascii() and self.device[5:].isdigit()):
            raise UsageError(f"device={self.device!r} is invalid: choose auto, cpu, cuda, cuda:N or mps")
        if not 0 <= self.ema_decay < 1:
            raise UsageError(f"ema_decay={self.ema_decay} is invalid: use a value in [0, 1) (0: no averaging)")
        if self.score_evals < 1:
            raise UsageError(f"score_evals={self.score_evals} is invalid: give at least 1")
        if isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int) or self.micro_batch < 0 \
                or (self.micro_batch and self.batch_size % self.micro_batch):
            raise UsageError(f"micro_batch={self.micro_batch!r} is invalid: give 0 (the whole batch) or a divisor "
                             f"of the batch of {self.batch_size} sequences")
        if self.dtype not in ("fp32", "bf16"):
            raise UsageError(f"dtype={self.dtype!r} is invalid: choose fp32 or bf16")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def steps(self) -> int:
        """Optimiser steps: the token budget in whole batches (at least one)."""
        return max(1, self.tokens // self.tokens_per_step)

    def whole_steps_note(self) -> str | None:
        """What a run trains where the token budget is no whole number of steps (``steps`` rounds it down); None
        where it is."""
        if self.tokens % self.tokens_per_step == 0:
            return None
        return (f"{self.tokens:,} tokens are no whole number of steps of {self.batch_size} x {self.seq_len} = "
                f"{self.tokens_per_step:,} tokens: each run trains {self.steps:,} steps, "
                f"{self.steps * self.tokens_per_step:,} tokens")

    def with_(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def result_fields(self) -> dict[str, Any]:
        """The fields that change what a run computes (``RUN_ONLY_FIELDS`` left out): what identifies a run or study."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_ONLY_FIELDS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown TrainConfig field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**data)
