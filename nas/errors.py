"""The error types the CLI turns into one line: ``UsageError`` (exit code 2) and ``SearchAborted`` (exit code 1)."""


class UsageError(ValueError):
    """Bad input from the user: the message names the bad value and what would be valid."""


class SearchAborted(RuntimeError):
    """A search cannot go on (every trial crashes, the storage failed...): one line saying why, exit code 1."""
