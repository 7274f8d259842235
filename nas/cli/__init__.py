"""The command line (``nas ...``): parses options and prints; the work lives in the packages below it.

One module per group of commands; importing them registers their commands on ``app``.
Heavy libraries (torch, optuna) are imported inside the commands, so ``nas --help`` and a
mistyped option are answered at once.
"""

from nas.cli import results, runs, search, space, tools  # noqa: F401  (registers commands, in --help order)
from nas.cli.app import app

app.add_typer(space.space_app, name="space")


def main() -> None:
    """The ``nas`` console script."""
    app()


__all__ = ["app", "main"]
