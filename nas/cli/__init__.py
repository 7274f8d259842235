"""The command line (``nas ...``): parses options and prints; the work lives in the packages below it.

One module per group of commands; importing them registers their commands on ``app``.
Heavy libraries (torch, optuna) are imported inside the commands, so ``nas --help`` and a
mistyped option are answered at once.
"""

from nas.cli.app import app
from nas.cli.streams import guard_standard_streams

# isort: off
from nas.cli import search, results, rules, runs, rerun, tools, space  # noqa: F401  (registers the commands, in --help order)
# isort: on

app.add_typer(space.space_app, name="space")


def main() -> None:
    """The ``nas`` console script."""
    import signal
    import warnings

    from nas.cli.errors import one_line_warning

    guard_standard_streams()
    warnings.formatwarning = one_line_warning  # forked workers inherit it
    # `kill -INT` stops every command as Ctrl-C does (exit 130), also one a shell started in the background with SIGINT
    # ignored, which Python keeps; SIGTERM keeps its default (the process ends) except where a long command handles
    # it (search, train, rerun: nas.study.signals.interruptible), since a handler's exception can be swallowed
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    app()


__all__ = ["app", "main"]
