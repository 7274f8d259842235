"""Standard output that is closed or full: one line and exit code 1, never a traceback or a file written by mistake.

``guard_standard_streams`` runs first in ``nas``: a descriptor 0-2 that the shell closed (``nas best >&-``)
gets ``/dev/null`` in its place, so that no file the command opens later (the database, a data file) takes
descriptor 1 and receives a child process's output; a closed standard output then refuses every write
(``ClosedOutput``). ``flush_stdout`` ends every command: a full device (``> /dev/full``) or a closed pipe
(``| head -1``) is found there and reported instead of Python's "Exception ignored" at exit.
"""

from __future__ import annotations

import io
import os
import sys

from nas.files import OutputClosed


class ClosedOutput(io.TextIOBase):
    """What ``sys.stdout`` becomes when the shell closed it: every write fails with ``OutputClosed``."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            raise OutputClosed("standard output is closed (>&-): nothing could be printed")
        return 0


class GuardedOutput(io.TextIOBase):
    """``sys.stdout`` with its failures named: a write or flush the device refuses (full, a closed pipe) raises
    ``OutputClosed``, which the command line turns into one line and exit code 1."""

    def __init__(self, inner: io.TextIOBase) -> None:
        self.inner = inner

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.inner.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.inner.errors

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if not text:  # a probe (click writes "" to learn the stream's kind): nothing to fail on
            return 0
        try:
            try:
                return self.inner.write(text)
            except UnicodeEncodeError:  # a name this terminal's encoding cannot show (LC_ALL=C, PYTHONIOENCODING=ascii)
                encoding = self.inner.encoding or "ascii"  # shown escaped, as Python shows it on standard error
                return self.inner.write(text.encode(encoding, "backslashreplace").decode(encoding))
        except OSError as error:
            raise OutputClosed.of(error) from None

    def flush(self) -> None:
        try:
            self.inner.flush()
        except OSError as error:
            raise OutputClosed.of(error) from None


def guard_standard_streams() -> None:
    """Closed descriptors 0-2 replaced by /dev/null, and ``sys.stdout`` guarded (module docstring)."""
    if sys.stdout is not None and not isinstance(sys.stdout, GuardedOutput):
        sys.stdout = GuardedOutput(sys.stdout)
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            if fd == 1:
                sys.stdout = ClosedOutput()
            elif fd == 2:
                sys.stderr = open(2, "w", closefd=False)


def flush_stdout() -> None:
    """Flush standard output; ``OutputClosed`` (and the descriptor pointed at /dev/null) if it cannot take it."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as error:
        silence_stdout()
        raise OutputClosed.of(error) from None
    except ValueError:  # flushed after close: nothing is pending
        pass


def silence_stdout() -> None:
    """Point descriptor 1 at /dev/null so that the interpreter's own last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
