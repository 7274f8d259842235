"""The ``nas`` command tree as a Click object, for the docs' CLI reference (``mkdocs-click``): generated."""

from __future__ import annotations

import typer

from nas.cli import app

command = typer.main.get_command(app)  # every command, option, default and help text of the app, as --help shows
