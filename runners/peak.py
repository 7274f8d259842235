"""The device's matmul peak, measured: what MFU (model FLOP utilisation) of a full-scale run is measured against.

A run's MFU is ``flops_per_token * tokens_per_s_per_device / peak``, with ``flops_per_token``
from ``ArchConfig.flops_per_token`` (6 N + attention, the PaLM convention) and ``peak`` the
median FLOP/s of large square matmuls in the run's compute dtype on the run's device, measured
at the start of the run (a data-sheet peak would not say what this machine, with these
threads, delivers). CPU: fp32, 1024^3 products; CUDA: bf16 (or fp32), 8192^3 products.
"""

from __future__ import annotations

import statistics
import time

import torch


def measure_matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, repeats: int = 7) -> float:
    """Median FLOP/s of ``repeats`` square matmuls on ``device`` (one warm-up first)."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)
