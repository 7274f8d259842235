"""The ``nas`` Typer app: the root group renders every usage error as one line (``nas.cli.errors``)."""

from __future__ import annotations

import typer

from nas.cli.errors import OneLineErrors

app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="prism-nas: search the shape of decoder-only Transformers (Prism head schedules, "
                       "Hourglass FFNs) with Optuna.")
