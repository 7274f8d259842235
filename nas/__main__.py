"""``python -m nas``: the ``nas`` command, entered as the console script enters it (``nas.console``), so that a stop
while the application loads is one line (``python -m nas.cli`` loads it before anything can catch one)."""

from nas.console import main

main()
