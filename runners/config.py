"""``TrainConfig``: everything about a training run that is not the shape itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from nas.errors import UsageError


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
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "fp32"  # fp32 | bf16 (autocast on CUDA)
    compile: bool = False  # torch.compile: ~30 s cold on CPU for ~9 % speed, so off for CPU proxies
    threads: int = 0  # torch intra-op threads; 0 = the cores this process may use

    def __post_init__(self) -> None:
        positive = ("tokens", "batch_size", "seq_len", "eval_every", "eval_tokens")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(f"{name}={getattr(self, name)} is invalid: it must be positive")
        if self.threads < 0:
            raise UsageError(f"threads={self.threads} is invalid: give 0 (every usable core) or a positive count")
        if self.lr <= 0:
            raise UsageError(f"lr={self.lr} is invalid: it must be positive")
        if not 0 <= self.warmup_frac < 1:
            raise UsageError(f"warmup_frac={self.warmup_frac} is invalid: use a value in [0, 1)")
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            raise UsageError(f"device={self.device!r} is invalid: choose auto, cpu, cuda, cuda:N or mps")
        if self.dtype not in ("fp32", "bf16"):
            raise UsageError(f"dtype={self.dtype!r} is invalid: choose fp32 or bf16")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def steps(self) -> int:
        """Optimiser steps: the token budget in whole batches (at least one)."""
        return max(1, self.tokens // self.tokens_per_step)

    def with_(self, **changes: Any) -> TrainConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"unknown TrainConfig field(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
        return cls(**data)
