"""Where and how a run executes: device choice, dtype context, threads, peak memory, loss reads, SDPA kernels."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from pathlib import Path

import torch

from nas.errors import UsageError
from runners import cores


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


def check_runnable(device_name: str, dtype: str, compiling: bool, what: str) -> torch.device:
    """The device runs set up by ``what`` (``preset gpu-prism``, ``--device cuda:1``) train on, checked before
    anything is written: the device is there, takes the dtype, and can compile when asked (Inductor: a C++ compiler
    on the CPU, Triton on CUDA); else one ``UsageError`` naming what is missing and what would run."""
    try:
        device = resolve_device(device_name)
    except UsageError:
        raise UsageError(f"{what}: this machine has no {device_name!r} device: run it where there is one, or give "
                         "--device cpu (or auto)") from None
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"{what}: it trains in bf16, which {torch.cuda.get_device_name(device)} does not support: "
                         "run it on a GPU that does (compute capability 8.0 or later)")
    if compiling:
        missing = _compile_missing(device)
        if missing:
            raise UsageError(f"{what}: torch.compile needs {missing} on this machine, which it lacks: give "
                             "--no-compile")
    return device


def _compile_missing(device: torch.device) -> str | None:
    """What ``torch.compile``'s Inductor backend needs for ``device`` and cannot find, in words; None when found."""
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "Triton (pip install triton)"
    if device.type == "cpu":
        from torch._inductor import cpp_builder, exc

        try:
            cpp_builder.get_cpp_compiler()
        except (exc.InvalidCxxCompiler, RuntimeError, OSError):
            return "a C++ compiler (g++ or clang++, or $CXX)"
    return None


def set_threads(threads: int) -> int:
    """Set torch's intra-op threads (0 = all available cores); returns the number set."""
    n = threads if threads > 0 else cores.available_cores()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def configure_threads(threads: int, compiling: bool = False) -> int:
    """Torch's intra-op threads for a run (0: every core this process may use) on any device, and when it compiles,
    at most as many Inductor compile workers; returns the thread count.

    A GPU run needs it too: ``--workers 8`` on a GPU node puts 8 processes on one CPU, and each would otherwise
    use every core for its host-side ops and start its own pool of compile workers (Inductor's default is up to
    32 per process), so the ``GPU_WORKER_THREADS`` of ``nas.study.placement`` would be a promise only.
    """
    n = set_threads(threads)
    if compiling:
        import torch._inductor.config as inductor

        inductor.compile_threads = max(1, min(n, inductor.compile_threads or inductor.decide_compile_threads()))
    return n


def compiles_by_default(device: torch.device) -> bool:
    """Whether ``nas train`` / ``nas rerun`` compile when not told: on CUDA (bf16 GPT-2-scale steps gain from
    Inductor's fused kernels and the cold compile is a minute of a multi-hour run), not on the CPU (``TrainConfig``:
    ~30 s cold for ~9 %)."""
    return device.type == "cuda"


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


LOSS_READ_EVERY_CUDA = 16  # steps between reads of the training losses on CUDA (each read waits for the device)


class StepLosses:
    """The training losses of the last steps, kept on the device and read back together.

    ``float(loss)`` every step makes the host wait for the device every step, so it cannot queue the next step's
    kernels while the GPU finishes this one. On CUDA the losses stay on the device and are read ``every`` steps
    (and at each logging point: ``read`` whenever the caller needs them) in one transfer; on the CPU there is
    nothing to wait for and ``every`` is 1, the same ``float(loss)`` as before. ``wait_s`` is the host's time
    spent in those reads: on CUDA, what the steps since the last read waited for the device.
    """

    def __init__(self, device: torch.device, every: int | None = None) -> None:
        self.every = every if every is not None else (LOSS_READ_EVERY_CUDA if device.type == "cuda" else 1)
        self._pending: list[torch.Tensor] = []
        self.wait_s = 0.0

    def add(self, loss: torch.Tensor) -> None:
        self._pending.append(loss.detach())

    @property
    def due(self) -> bool:
        return len(self._pending) >= self.every

    def read(self) -> list[float]:
        """Every loss added since the last read, oldest first (one device sync for all of them)."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        start = time.perf_counter()
        values = [float(pending[0])] if len(pending) == 1 else torch.stack(pending).tolist()
        self.wait_s += time.perf_counter() - start
        return values


FLASH_MAX_HEAD_DIM = 256  # FlashAttention-2 in PyTorch's SDPA: q, k, v head dims at most 256 (sdp_utils.cpp)


def sdpa_kernel(head_dim: int, capability: tuple[int, int] | None, dtype: torch.dtype = torch.bfloat16,
                training: bool = True) -> str:
    """The kernel PyTorch's ``scaled_dot_product_attention`` dispatch gives causal self-attention of this head dim.

    ``capability``: the CUDA device's compute capability (``torch.cuda.get_device_capability``), None off CUDA.
    Returns ``flash`` (a fused flash-style kernel: FlashAttention-2, or cuDNN's where torch tries it first, on
    sm90/sm100 with cuDNN > 9.15, for head dims it takes), ``efficient`` (the memory-efficient CUTLASS kernel),
    ``math`` (unfused: the (T, T) scores in memory) or ``cpu``. The rules of
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (torch 2.4-2.13) for dense, unmasked, causal,
    dropout-free inputs of equal q, k, v head dims:

    - flash: fp16/bf16, sm80-sm121, head dim <= 256; in training not (192, 224] on sm86-89 and sm120-121
      (its backward has no kernel there);
    - efficient: sm50 and later, head dim a multiple of the GEMM alignment (8 in fp16/bf16 and 4 in fp32 on
      sm80+; 8 for halves on sm70-75 tensor cores; 1 before);
    - else math.

    ``benchmarks/gpu_check.py`` compares this with torch's own ``can_use_*_attention`` on the GPU and times each.
    """
    if capability is None:
        return "cpu"
    half = dtype in (torch.float16, torch.bfloat16)
    if half and (8, 0) <= capability <= (12, 1) and head_dim <= FLASH_MAX_HEAD_DIM and not (
            training and ((8, 6) <= capability <= (8, 9) or capability >= (12, 0)) and 192 < head_dim <= 224):
        return "flash"
    if capability >= (8, 0):
        alignment = 8 if half else 4
    else:
        alignment = 8 if half and capability >= (7, 0) else 1
    if capability >= (5, 0) and head_dim % alignment == 0:
        return "efficient"
    return "math"


def attention_kernels(head_dims: list[int] | tuple[int, ...], capability: tuple[int, int] | None,
                      dtype: torch.dtype = torch.bfloat16) -> str:
    """A schedule's SDPA kernels by head dim, for a progress line: ``head dim 768 x2: efficient; 64 x10: flash``."""
    counts: dict[int, int] = {}
    for dim in head_dims:
        counts[dim] = counts.get(dim, 0) + 1
    return "; ".join(f"head dim {dim} x{n}: {sdpa_kernel(dim, capability, dtype)}" for dim, n in counts.items())
