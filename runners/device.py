"""Where and how a run executes: device choice, dtype context, thread count, peak memory."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from pathlib import Path

import torch

from nas.errors import UsageError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; an explicit device that is absent is a usage error."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device={name!r} is not available on this machine: use auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError("device='mps' is not available on this machine: use auto or cpu")
    return torch.device(name)


def available_cores() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def set_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = all available cores); returns the number set."""
    n = threads if threads > 0 else available_cores()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA (and CPU when asked); fp32 runs without autocast."""
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


_CLEAR_REFS = Path("/proc/self/clear_refs")  # Linux: writing "5" resets the peak resident set size (VmHWM)
_STATUS = Path("/proc/self/status")


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: CUDA's allocator statistics, or (Linux) the process's peak resident set size."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:  # not Linux, or not allowed: the peak stays the process's lifetime peak
        return


def _status_kib(field: str) -> int | None:
    """A ``VmXXX:  1234 kB`` line of ``/proc/self/status`` in KiB; None where there is none."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated since the last reset. CPU: peak resident set size since the last reset on Linux
    (``reset_peak_memory``), the process's lifetime peak elsewhere."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = _status_kib("VmHWM")
    if peak is not None:
        return peak / 2**10
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        "out of memory" in text or "can't allocate memory" in text or isinstance(error, MemoryError)
    )
