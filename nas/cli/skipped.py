"""What every command that reads a study says about the trials it could not read (``nas best``, ``nas report``,
``nas export`` in each format): its own module, so that the export's commands and the model-directory export
share it without importing each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from reports.frame import StudyData


def warn_skipped(data: StudyData) -> None:
    """One warning line on stderr per trial whose stored attrs could not be read (``reports.frame.readable_trials``)."""
    for line in data.skipped:
        typer.echo(f"warning: {line}", err=True)
