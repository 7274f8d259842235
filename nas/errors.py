"""The one error type the CLI turns into a one-line message and exit code 2."""


class UsageError(ValueError):
    """Bad input from the user: the message names the bad value and what would be valid."""
