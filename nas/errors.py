"""The error types the CLI turns into one line: ``UsageError`` (exit code 2) and ``SearchAborted`` (exit code 1).

``printable`` shows a name from the user or the storage (a study name, a label) safely in a message or table.
"""

import unicodedata

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a job Ctrl-C stopped
INTERRUPTED_LINE = "interrupted: the command stopped before it finished; run the same command again"
# a stop in the instant after the command's work returned (its output being flushed, the process exiting)
INTERRUPTED_DONE_LINE = "interrupted as the command ended: its work was done"
UNPRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # controls, format marks, surrogates (bad UTF-8)...


def _escaped(char: str) -> str:
    if 0xDC80 <= ord(char) <= 0xDCFF:  # a byte that was not UTF-8, as Python carries it (surrogateescape)
        return f"\\x{ord(char) - 0xDC00:02x}"
    if unicodedata.category(char) in UNPRINTABLE or char in "'\\":
        return char.encode("unicode_escape").decode("ascii") if char not in "'\\" else "\\" + char
    return char


def quoted(text: str) -> str:
    """``text`` in single quotes with everything that would not print as itself escaped (``'a\\x1b[31m'``,
    ``'b\\xff'`` for a byte that was not UTF-8): what a message shows of a name or path."""
    return "'" + "".join(_escaped(c) for c in text) + "'"


def printable(text: str) -> str:
    """``text`` itself when every character prints as itself, else ``quoted(text)``."""
    if all(unicodedata.category(c) not in UNPRINTABLE for c in text):
        return text
    return quoted(text)


class UsageError(ValueError):
    """Bad input from the user: the message names the bad value and what would be valid."""


class SearchAborted(RuntimeError):
    """A search cannot go on (every trial crashes, the storage failed...): one line saying why, exit code 1."""
