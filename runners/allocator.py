"""The C allocator's settings a training process runs best with, applied by the process itself.

glibc serves every allocation above its mmap threshold (32 MB at most, adapting) with a fresh ``mmap`` and hands it
back to the kernel when freed; it also trims the heap's top once more than its trim threshold is free. A training
step allocates and frees the same large buffers every step (logits, activations, gradients), so each step pays the
page faults of zero-filled fresh pages again: measured on a 2-core AMD EPYC (fp32 matmul peak ~143 GFLOP/s), the
main job took 15.3-17.7 minutes as installed and 11.7 with ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`` set by
hand (``../shared/docs/cpu-measurements.md``: V8192 steps 23 % faster). ``keep_freed_memory`` makes the same two
settings with ``mallopt`` for the process it runs in (they act on every later allocation), so that no one has to
know the variables: freed memory stays in the process for the next step instead of going back to the kernel.
The process's resident set then holds its peak instead of shrinking between steps.

A setting the user made in the environment (``MALLOC_MMAP_MAX_`` or ``MALLOC_TRIM_THRESHOLD_``) is left as it is,
as is ``NAS_KEEP_ALLOCATOR=1``; on a C library without ``mallopt`` (musl, macOS) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1  # glibc malloc.h: bytes free at the heap's top before it is handed back
M_MMAP_MAX = -4  # glibc malloc.h: how many allocations may be served by mmap at once (0: none)
TRIM_THRESHOLD = -1  # glibc's mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"
USER_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "NAS_KEEP_ALLOCATOR")


def keep_freed_memory() -> bool:
    """No ``mmap`` for large allocations and no trimming, for this process (module docstring); whether applied."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
