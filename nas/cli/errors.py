"""How the command line fails: every usage error is one line on stderr and exit code 2.

Commands raise ``nas.errors.UsageError`` (the library's one error type for bad input) and
never catch it; ``OneLineErrors``, the root group of the ``nas`` app, renders it, and renders
the framework's own usage errors (an unknown choice, a missing option) the same way instead
of click's usage block.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from nas.cli.streams import flush_stdout, silence_stdout
from nas.errors import INTERRUPTED_DONE_LINE, INTERRUPTED_EXIT_CODE, INTERRUPTED_LINE, UsageError
from nas.files import OutputClosed
from nas.study.sqlite_file import release_readers

USAGE_EXIT_CODE = 2


def print_error(message: str) -> None:
    """``error: <message>`` as one line on stderr (a multi-line message is joined)."""
    message = " ".join(message.split()).replace("Value error, ", "")  # the framework's coercion prefixes its own
    typer.echo("error: " + message, err=True)


class OneLineErrors(TyperGroup):
    """The root command group: runs the command, then turns a usage error into one line and exit code 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        returned = False
        try:
            # non-standalone: exceptions come back to us, and an Exit(n) comes back as its code n
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                **extra)
            returned = True
            flush_stdout()
        except KeyboardInterrupt:
            if not returned:
                raise
            typer.echo(INTERRUPTED_DONE_LINE, err=True)  # not "before it finished": there is nothing to run again
            code = INTERRUPTED_EXIT_CODE
        except OutputClosed as error:
            silence_stdout()
            if not error.quiet:
                print_error(str(error))
            code = 1
        except UsageError as error:
            print_error(str(error))
            code = USAGE_EXIT_CODE
        except typer.TyperException as error:  # the framework's: bad choice, no such option, missing value ...
            if type(error).__name__ == "NoArgsIsHelpError":  # `nas` or `nas space` alone: the help, as usual
                error.show()  # type: ignore[attr-defined]
            else:
                print_error(_with_given_value(error.format_message(), error, args))
            code = getattr(error, "exit_code", USAGE_EXIT_CODE)
        except typer.Abort:
            print_error("aborted")
            code = 1
        try:  # a read leaves no file beside the study (SQLite's -wal and -shm that its readers made)
            release_readers()
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED_DONE_LINE, err=True)
            code = INTERRUPTED_EXIT_CODE
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        """Read the command line; a stop meanwhile gets the one line too (typer exits 130 without a word)."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED_LINE, err=True)
            raise typer.Exit(INTERRUPTED_EXIT_CODE) from None

    def invoke(self, ctx: Any) -> Any:
        """Run the command; a stop it does not explain itself (Ctrl-C while a read command works, or while ``nas
        search`` still loads torch) gets one line, where the framework exits 130 without a word."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED_LINE, err=True)
            raise typer.Exit(INTERRUPTED_EXIT_CODE) from None


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     line: str | None = None) -> str:
    """``warning: <message>``, the command line's own form (``warnings.formatwarning``): Python's adds the file, the
    line number and the source line of whatever warned, which a user cannot act on."""
    return "warning: " + " ".join(str(message).split()) + "\n"


def _with_given_value(message: str, error: Exception, args: Sequence[str] | None) -> str:
    """Name the value the user typed when the framework's message does not (``'many' is not a valid integer``)."""
    opts = getattr(getattr(error, "param", None), "opts", None) or []
    argv = list(sys.argv[1:] if args is None else args)
    given = [(opt, value) for i, arg in enumerate(argv) for opt in opts
             if (value := argv[i + 1] if arg == opt and i + 1 < len(argv) else
                 arg[len(opt) + 1:] if arg.startswith(opt + "=") else None) is not None]
    if not given:
        return message
    opt, value = given[-1]  # an option given twice: the framework read (and refused) the last
    if repr(value) in message:
        return message
    return message.replace(f"'{opt}'", f"'{opt}' ({value!r})", 1) if f"'{opt}'" in message \
        else f"{message} (got {value!r})"
