"""A child process that dies with its parent: torchrun's workers, a re-run's trainer, a search's workers.

Without torch: a search's parent and ``nas rerun`` call it before anything trains.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Receive SIGKILL when the parent process dies (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing).

    torchrun starts its workers in sessions of their own: without this, a killed ``torchrun`` (or a
    killed ``nas rerun`` above it) would leave them training on, orphaned, racing the resumed run.
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name and sys.platform.startswith("linux"):
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
