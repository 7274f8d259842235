"""Options shared by several commands, and the fixed choices as ``Enum``s (the framework checks and lists them).

Each choice ``Enum`` is built from the library's own tuple of valid values, so the command
line cannot drift from what the library accepts; commands hand the library plain strings
(``choice.value``).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

from nas.study.config import PRUNERS, REPLICATES, SAMPLERS
from search_spaces.factory import SPACES
from search_spaces.hourglass import FIX_CHOICES


def choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A ``str`` Enum whose members are ``values``: ``choices("Space", ("prism", ...)).prism.value == "prism"``."""
    return Enum(name, [(value.replace("-", "_"), value) for value in values], type=str)  # type: ignore[return-value]


Space = choices("Space", SPACES)
Sampler = choices("Sampler", SAMPLERS)
Pruner = choices("Pruner", PRUNERS)
Replicates = choices("Replicates", REPLICATES)
Fix = choices("Fix", (*FIX_CHOICES, "none"))
Dtype = choices("Dtype", ("fp32", "bf16"))
TableOrJson = choices("TableOrJson", ("table", "json"))
ListFormat = choices("ListFormat", ("table", "json", "csv"))


def plain(value: Any) -> Any:
    """An Enum choice as its value (what the library takes); anything else unchanged."""
    return value.value if isinstance(value, Enum) else value


StorageOpt = Annotated[str, typer.Option("--storage", help="SQLAlchemy URL of the Optuna storage "
                                         "(PostgreSQL for many machines); not a file SQLite keeps beside a database "
                                         "(-wal, -shm, -journal, -searches).")]
StudyOpt = Annotated[str | None, typer.Option("--study-name", help="Study name (default: the only study in the "
                                                 "storage; `nas search` derives it from space, preset and options).",
                                                 show_default=False)]
