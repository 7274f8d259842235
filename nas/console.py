"""The ``nas`` console script's first code: a stop while the command line application still loads is one line.

Loading ``nas.cli`` (typer, the commands) takes about 0.1 s, before ``nas.cli.main`` can catch anything: a Ctrl-C
then printed Python's ``KeyboardInterrupt`` traceback. This module imports only ``nas.errors`` first.
"""

import sys

from nas.errors import INTERRUPTED_EXIT_CODE, INTERRUPTED_LINE


def main() -> None:
    """``nas``: load the application, then run it (``nas.cli.main``)."""
    try:
        from nas.cli import main as run
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)
    run()
