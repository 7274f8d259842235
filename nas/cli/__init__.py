"""The command line (``nas ...``): parses options and prints; the work lives in the packages below it."""

from nas.cli.commands import app, main

__all__ = ["app", "main"]
