"""What a training run needs in memory, against what this machine gives a process, checked before anything is built.

A shape of 1.7e11 parameters passes the shape's own limit (``nas.arch.MAX_PARAMS``) and needs some 2.7 TB to train;
built anyway, it dies in the allocator with a traceback, after its output folder was made. ``check_fits`` refuses
it first, in one line, from arithmetic that is a lower bound (so nothing that would fit is refused):

- **state**: fp32 weights, their gradients and AdamW's two moments (``4 x 4`` bytes a parameter), plus the weight
  average when the run scores one (``ema_decay > 0``): 4 more, and under bf16 autocast the weights' bf16 copies: 2;
- **activations** of one forward of the micro-batch, per token: the logits beside cross-entropy's fp32
  log-probabilities (``V`` values each, alive together as the forward ends; under bf16 the logits' fp32 copy too),
  and what autograd keeps of each layer for the backward (``activation_bytes``: the layer's input and normed
  input, the output projection's input, q k v; per sub-MLP its input, normed input, gate, up and gated product),
  4 bytes a value (2 under bf16 autocast, but for the fp32 residual stream). Checked against the tensors a real
  forward saves (``tests/test_cli_commands.py``: 0.45-1.0 of them); a step's peak is up to ~2x those (the
  backward's gradients, the allocator's slack). An estimate of the logits and one value a layer, as before, let a
  GPT-2 small run of 32 x 1024 tokens on a CPU past at "5.9 GB", and it took the machine's 24 GB. A run that
  passes the check and still runs out of memory ends in one line (``nas train``), not a traceback.

What a process may use (``available_bytes``): on CUDA, the device's free memory; elsewhere the least of the memory
Linux says is available (``MemAvailable`` plus free swap), the cgroup's limit less its usage, and the address space
left under ``RLIMIT_AS`` (``ulimit -v``). What cannot be read is not a limit.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

import torch

from nas.arch import ArchConfig
from nas.errors import UsageError
from runners.config import TrainConfig

STATE_BYTES = 4 * 4  # fp32 weight, gradient, AdamW exp_avg and exp_avg_sq
EMA_BYTES = 4
_MEMINFO = Path("/proc/meminfo")
_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@dataclass(frozen=True)
class Need:
    """The lower bound of one process's training memory, by part (bytes)."""

    params: int
    state: int  # weights, gradients, optimiser moments, weight average
    activations: int  # one forward of the micro-batch: logits and log-probabilities, what each layer keeps

    @property
    def total(self) -> int:
        return self.state + self.activations


def activation_bytes(arch: ArchConfig, width: int, compiled: bool = False) -> int:
    """Bytes autograd keeps a token for the backward, over the layers, at ``width`` bytes a value (4, or 2 under bf16
    autocast) except the residual stream (fp32 either way): per layer its input (4 bytes a value) and ``2 d`` values
    (normed input, the output projection's input) plus q, k, v (``d + 2 kv_l d / h_l``); per sub-MLP its input (4
    bytes a value) and ``d + 3 hidden`` values (normed input; gate, up and their gated product). ``compiled``: the
    residual stream only, since a compiled graph may recompute the rest in its backward (Inductor's min-cut
    partitioner does)."""
    d = arch.d_model
    if compiled:
        return arch.n_layers * (1 + arch.ffn.k) * 4 * d
    kv = arch.kv_heads or arch.heads
    attention = sum(4 * d + (3 * d + 2 * kv_l * (d // h_l)) * width for h_l, kv_l in zip(arch.heads, kv, strict=True))
    return attention + arch.n_layers * arch.ffn.k * (4 * d + (d + 3 * arch.ffn.hidden) * width)


def training_need(arch: ArchConfig, cfg: TrainConfig, rows: int) -> Need:
    """The lower bound of what training ``arch`` at ``cfg`` takes in one process whose forward sees ``rows``
    sequences (module docstring)."""
    n = arch.n_params()["total"]
    width = 2 if cfg.dtype == "bf16" else 4
    # bf16 autocast keeps a bf16 copy of each weight through the forward
    state = n * (STATE_BYTES + (EMA_BYTES if cfg.ema_decay > 0 else 0) + (2 if width == 2 else 0))
    # the logits, and cross-entropy's fp32 log-probabilities of them (under bf16, of their fp32 copy: alive too)
    per_token = arch.vocab_size * (width + 4 + (4 if width == 2 else 0)) + activation_bytes(arch, width,
                                                                                          compiled=cfg.compile)
    return Need(n, state, rows * cfg.seq_len * per_token)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_bytes() -> int | None:
    """``MemAvailable`` plus ``SwapFree`` of ``/proc/meminfo`` in bytes; None off Linux."""
    try:
        fields = dict(line.split(":", 1) for line in _MEMINFO.read_text().splitlines() if ":" in line)
        return sum(int(fields[k].split()[0]) * 1024 for k in ("MemAvailable", "SwapFree") if k in fields) or None
    except (OSError, ValueError):
        return None


def _cgroup_bytes() -> int | None:
    """The cgroup's memory limit less its usage (v2, then v1); None where there is no limit."""
    for limit, usage in ((_CGROUP_V2 / "memory.max", _CGROUP_V2 / "memory.current"),
                         (_CGROUP_V1 / "memory.limit_in_bytes", _CGROUP_V1 / "memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and cap < 2**60:  # v1 writes its "no limit" as a huge number
            return max(0, cap - (used or 0))
    return None


def _address_space_bytes() -> int | None:
    """The address space left under the soft ``RLIMIT_AS`` (this process's mappings subtracted); None without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        status = Path("/proc/self/status").read_text()
        used = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        used = 0
    return max(0, soft - used)


def available_bytes(device: torch.device) -> tuple[int, str] | None:
    """What one process may allocate on ``device``, with where the figure comes from; None when nothing says."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"{torch.cuda.get_device_name(device)} has free"
    if device.type != "cpu":
        return None
    limits = [(value, what) for value, what in ((_meminfo_bytes(), "this machine has available"),
                                                (_cgroup_bytes(), "this process's cgroup allows"),
                                                (_address_space_bytes(), "the address-space limit (ulimit -v) "
                                                                         "leaves"))
              if value is not None]
    return min(limits) if limits else None


def _size(n: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 10**3:.0f} kB"


def check_fits(arch: ArchConfig, cfg: TrainConfig, device: torch.device, rows: int, processes: int = 1,
               what: str = "training") -> Need:
    """``UsageError`` in one line when ``processes`` processes training ``arch`` on this machine (each a forward of
    ``rows`` sequences) need more than it gives them; the need otherwise."""
    need = training_need(arch, cfg, rows)
    found = available_bytes(device)
    total = need.total * (processes if device.type != "cuda" else 1)  # CUDA processes have a device each
    if found is None or total <= found[0]:
        return need
    shared = f" x {processes} processes" if processes > 1 and device.type != "cuda" else ""
    smaller = " or a smaller --micro-batch" if need.activations > need.state else ""
    raise UsageError(f"{what} {arch.label()} needs at least {_size(total)}{shared} ({need.params:,} parameters: "
                     f"weights, gradients and optimiser state {_size(need.state)}; activations of {rows} sequences "
                     f"of {cfg.seq_len} tokens {_size(need.activations)}) but {found[1]} {_size(found[0])}: give a "
                     f"smaller shape{smaller}")
