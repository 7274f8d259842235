"""What every figure shares: the process environment, machine facts, interleaved timing, training steps, output.

Timing rule: a figure is always a *ratio* measured in one process run, never two absolute
numbers from different runs. ``sandwich`` interleaves a reference block R with each contender
block C as ``R C1 R C2 ... R Cn R`` (contender order rotated every round); a contender's ratio
in one round is ``mean(R before, R after) / C``, and the figure reports the median over rounds
(with the inter-quartile range). Load from other processes that drifts over seconds cancels in
the ratio; what remains shows up as the spread.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

# glibc keeps freed buffers instead of returning them to the OS and zero-filling them again
# every step (docs: cpu-measurements.md, +10-23 % on CPU at large vocabularies). OpenMP's wait
# policy is left at its default, as `nas search` runs it: OMP_WAIT_POLICY=PASSIVE survives a
# shared machine (a d96 step took 8.8 s with spinning threads under load, 0.27 s passive) but
# made an idle machine's small-model steps ~25 % slower, which is not what a user's search sees.
# Run the benchmarks on an idle machine; the header records the load average.
ENV_DEFAULTS = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
}
REEXEC_MARK = "PRISM_NAS_BENCH_REEXEC"


def missing_env() -> dict[str, str]:
    """The ``ENV_DEFAULTS`` the user has not set (a user's own value always wins)."""
    return {k: v for k, v in ENV_DEFAULTS.items() if k not in os.environ}


def reexec_with_env(module: str, argv: list[str]) -> None:
    """Restart ``python -m module argv`` with ``ENV_DEFAULTS`` set; they only act at process start."""
    missing = missing_env()
    if not missing or os.environ.get(REEXEC_MARK):
        return
    env = {**os.environ, **missing, REEXEC_MARK: "1"}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


# ----------------------------------------------------------------- machine facts
def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int, device: str) -> dict[str, Any]:
    import numpy
    import optuna
    import torch

    from nas.model import fused_cpu

    try:
        import transformers
        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    info: dict[str, Any] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "threads": threads,
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": hf_version,
        "optuna": optuna.__version__,
        "numpy": numpy.__version__,
        "env": {k: os.environ.get(k) for k in (*ENV_DEFAULTS, "OMP_WAIT_POLICY", "OMP_NUM_THREADS")},
        "load_avg_start": _loadavg(),
        "fused_cpu_kernels": fused_cpu.status(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------- timing
def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str = "cpu") -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@dataclass
class Ratio:
    """Speed of a contender relative to the reference: > 1 means the contender is faster."""

    median: float
    q25: float
    q75: float
    rounds: int
    seconds: float  # median time of one contender block
    ref_seconds: float  # median time of the reference blocks beside this contender's (the ratio's own neighbours)

    def spread(self) -> str:
        return f"{self.q25:.2f}-{self.q75:.2f}"


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q[0], q[2]


def sandwich(reference: Callable[[], Any], contenders: dict[str, Callable[[], Any]], rounds: int,
             device: str = "cpu", warmup: int = 1) -> dict[str, Ratio]:
    """Interleave ``R C1 R C2 ... R Cn R`` for ``rounds`` rounds; ``ratio = mean(neighbouring R) / C`` per round.

    Every callable runs one block (a few training steps). Contender order rotates every round
    so no contender always follows the same one. A contender's ``ref_seconds`` is the median of
    its own neighbouring reference times, the ones its ratios divide by (a median over every
    reference block mixed in the load beside the other contenders).
    """
    names = list(contenders)
    for _ in range(warmup):
        reference()
        for name in names:
            contenders[name]()
    synchronize(device)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    beside: dict[str, list[float]] = {n: [] for n in names}  # the mean of each block's two neighbouring references
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        before = timed(reference, device)
        for name in order:
            t = timed(contenders[name], device)
            after = timed(reference, device)
            beside[name].append(0.5 * (before + after))
            ratios[name].append(beside[name][-1] / t)
            times[name].append(t)
            before = after
    out = {}
    for name in names:
        med, q25, q75 = _quartiles(ratios[name])
        out[name] = Ratio(med, q25, q75, rounds, statistics.median(times[name]), statistics.median(beside[name]))
    return out


# ----------------------------------------------------------------- training steps
def set_threads(threads: int) -> int:
    import torch

    from runners.cores import available_cores

    n = threads if threads > 0 else available_cores()
    torch.set_num_threads(n)
    return n


def random_batch(vocab: int, batch: int, seq_len: int, device: str, seed: int = 0):
    """Token ids ``x, y`` (B, T): the content does not change the speed, only the shape does."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return x[:, :-1].contiguous().to(device), x[:, 1:].contiguous().to(device)


def under(context: Callable[[], Any], step: Callable[[], None]) -> Callable[[], None]:
    """``step`` run inside ``context()`` each time (a kernel switched off for a reference block)."""

    def run() -> None:
        with context():
            step()

    return run


def training_step(model, loss_fn: Callable, batch, device: str, dtype: str = "fp32",
                  steps: int = 1) -> Callable[[], None]:
    """A closure running ``steps`` proxy training steps exactly as ``runners.proxy`` does.

    Forward, backward, global gradient clipping, fused AdamW (weight decay on matrices), zero
    grads to None. ``loss_fn(model, x, y)`` returns the scalar loss.
    """
    import torch

    from runners.config import TrainConfig
    from runners.device import autocast
    from runners.proxy import build_optimizer

    dev = torch.device(device)
    model.to(dev).train()
    optimizer = build_optimizer(model, TrainConfig(), dev)
    x, y = batch

    def run() -> None:
        for _ in range(steps):
            with autocast(dev, dtype):
                loss = loss_fn(model, x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def ours_loss(model, x, y):
    return model(x, y)


# ----------------------------------------------------------------- results
@dataclass
class Figure:
    """One benchmark's outcome: a table, its target and whether it was met (None: report only)."""

    number: int
    name: str
    title: str
    target: str
    method: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    passed: bool | None = None
    summary: str = ""
    seconds: float = 0.0
    smoke: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchConfig:
    smoke: bool = False
    threads: int = 0  # 0: every usable core
    device: str = "cpu"
    seed: int = 0
    cache_dir: str | None = None

    @property
    def dtype(self) -> str:
        return "bf16" if self.device.startswith("cuda") else "fp32"


def verdict(passed: bool | None, smoke: bool = False) -> str:
    word = {True: "PASS", False: "FAIL", None: "report"}[passed]
    return f"{word} (smoke)" if smoke else word


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "" if value is None else str(value).replace("|", "\\|")


def markdown(figures: list[Figure], info: dict[str, Any], command: str) -> str:
    lines = ["# prism-nas benchmarks", ""]
    lines.append(f"- command: `{command}`")
    lines.append(f"- date: {info['date_utc']}; machine: {info['cpu']}, {info['cores']} cores "
                 f"({info['cores_usable']} usable), {info['threads']} torch threads, device {info['device']}"
                 + (f" ({info['gpu']})" if info.get("gpu") else ""))
    lines.append(f"- versions: python {info['python']}, torch {info['torch']}, transformers "
                 f"{info['transformers']}, optuna {info['optuna']}, numpy {info['numpy']}")
    env = "`" + " ".join(f"{k}={v}" for k, v in info["env"].items() if v is not None) + "`" if any(
        v is not None for v in info["env"].values()) else "(none)"
    lines.append(f"- environment: {env}; load average at start {info.get('load_avg_start')}, "
                 f"at end {info.get('load_avg_end')}")
    lines.append(f"- fused CPU kernels (nas/fused_cpu.c): {info.get('fused_cpu_kernels')}")
    lines += ["", "| # | figure | target | result | verdict |", "|---|---|---|---|---|"]
    for f in figures:
        lines.append(f"| {f.number} | {f.title} | {_cell(f.target)} | {_cell(f.summary)} "
                     f"| {verdict(f.passed, f.smoke)} |")
    for f in figures:
        lines += ["", f"## {f.number}. {f.title}", "", f"Target: {f.target}. Result: {f.summary} "
                  f"(**{verdict(f.passed, f.smoke)}**, {f.seconds:.0f} s).", "", f"Method: {f.method}", ""]
        if f.rows:
            lines.append("| " + " | ".join(f.columns) + " |")
            lines.append("|" + "---|" * len(f.columns))
            for row in f.rows:
                lines.append("| " + " | ".join(_cell(row.get(c)) for c in f.columns) + " |")
    if any(f.smoke for f in figures):
        lines += ["", "_Smoke run: a few steps per benchmark, numbers are not measurements._"]
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: str, figures: list[Figure], info: dict[str, Any], command: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    info = {**info, "load_avg_end": _loadavg()}
    md_path, json_path = os.path.join(out_dir, "benchmarks.md"), os.path.join(out_dir, "benchmarks.json")
    with open(md_path, "w") as fh:
        fh.write(markdown(figures, info, command))
    payload = {"command": command, "machine": info, "figures": [f.to_dict() for f in figures],
               "passed": all(f.passed is not False for f in figures)}
    with open(json_path, "w") as fh:
        json.dump(_finite(payload), fh, indent=2, default=str, allow_nan=False)
    return md_path, json_path


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
