"""``python -m nas.cli``: the ``nas`` command."""

from nas.cli import main

main()
