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
    from nas.study.signals import interruptible

    guard_standard_streams()
    # every command stops on Ctrl-C, `kill -INT` (a background job starts with SIGINT ignored, which Python keeps)
    # and SIGTERM as on Ctrl-C: exit 130; the long ones (search, train, rerun) also say what they kept
    interruptible()
    app()


__all__ = ["app", "main"]
