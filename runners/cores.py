"""The cores this process may run on: what a search splits among its workers and a run gives torch's threads.

Without torch, so that a search's parent, which trains nothing, can ask it without importing torch (1.2-1.7 CPU-s
and ~150 MB a process on a 2-core machine).
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1
