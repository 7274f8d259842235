"""``TrialResult``: what one training run produced, JSON-serialisable, everything a report needs."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("ok", "pruned", "diverged", "oom", "error")


@dataclass
class TrialResult:
    """Outcome of ``runners.proxy.run``. ``status`` is one of ``STATUSES``; ``reason`` says why when not ok."""

    status: str
    val_loss: float  # last validation loss (nats per token); nan when none was measured
    eval_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens seen, val loss)
    train_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens seen, train loss), sparse
    tokens_seen: int = 0
    steps: int = 0
    tokens_per_s: float = 0.0  # training throughput, evaluation excluded
    train_time_s: float = 0.0  # the training steps (forward, backward, optimizer), evaluations excluded
    eval_time_s: float = 0.0  # the validation evaluations: the pruning points' and the final one with its analysis
    build_time_s: float = 0.0  # building the model and its optimizer
    wall_time_s: float = 0.0  # everything: build, training, evaluation, analysis
    peak_memory_mb: float = 0.0  # CUDA: max allocated; CPU: the run's peak resident set (Linux)
    params: dict[str, int] = field(default_factory=dict)
    flops_per_token: int = 0
    attention_distance: list[float] = field(default_factory=list)  # per layer, mean |i - j| under attention
    seed: int = 0
    device: str = "cpu"
    reason: str | None = None
    micro_batch: int = 0  # sequences per forward it trained with (halved from the batch after out-of-memory)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    @property
    def val_ppl(self) -> float:
        return math.exp(self.val_loss) if math.isfinite(self.val_loss) and self.val_loss < 700 else math.inf

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["val_ppl"] = self.val_ppl
        data["diverged"] = self.diverged
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        data = {k: v for k, v in data.items() if k not in ("val_ppl", "diverged")}
        data["eval_curve"] = [tuple(p) for p in data.get("eval_curve", [])]
        data["train_curve"] = [tuple(p) for p in data.get("train_curve", [])]
        return cls(**data)
