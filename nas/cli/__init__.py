"""The command line (``nas ...``): parses options and prints; the work lives in the packages below it.

One module per group of commands; importing them registers their commands on ``app``.
Heavy libraries (torch, optuna) are imported inside the commands, so ``nas --help`` and a
mistyped option are answered at once.
"""

from nas.cli.app import app
from nas.cli.streams import guard_standard_streams

# isort: off
from nas.cli import search, results, rules, runs, rerun, tools, space  # noqa: F401  (registers the commands, in --help order)
# isort: on

app.add_typer(space.space_app, name="space")


# the commands that stop on SIGTERM as on Ctrl-C (one line, exit 130): rules trains with --confirm; export removes
# the hidden folder it was writing (killed, it left one beside -o)
STOPPED_CLEANLY = ("search", "train", "rerun", "rules", "export")
# the commands that stop on SIGHUP (a closed terminal) as on SIGTERM: export, which a hangup's default death left
# with its hidden folder beside -o. The others need nothing: a search's trials are re-queued by the next search, a
# re-run's child dies with it and resumes from its checkpoint
STOPPED_ON_HANGUP = ("export",)


def main() -> None:
    """The ``nas`` console script."""
    import signal
    import sys
    import warnings

    from nas.cli.errors import INTERRUPTED_EXIT_CODE, INTERRUPTED_LINE, one_line_warning

    guard_standard_streams()
    warnings.formatwarning = one_line_warning  # forked workers inherit it
    # `kill -INT` stops every command as Ctrl-C does (exit 130), also one a shell started in the background with SIGINT
    # ignored, which Python keeps; SIGTERM keeps its default (the process ends) except where a long command handles
    # it (search, train, rerun: nas.study.signals.interruptible), since a handler's exception can be swallowed. Those
    # take it from here, so that one stopped while it still imports torch says so too (it ended with 143, silent)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if len(sys.argv) > 1 and sys.argv[1] in STOPPED_CLEANLY:
            from nas.study.signals import interruptible

            interruptible()
        if len(sys.argv) > 1 and sys.argv[1] in STOPPED_ON_HANGUP:
            from nas.study.signals import stop_on_hangup

            stop_on_hangup()
        app()
    except KeyboardInterrupt:  # before the command runs (the app is still being built) or after it returned
        print(INTERRUPTED_LINE, file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT_CODE)


__all__ = ["app", "main"]
