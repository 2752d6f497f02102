"""How the command line ends on an error: one line on stderr, never a traceback by default.

A user's mistake (a path that does not exist, a symlink loop, a number out of range, a
folder that holds no model, a question longer than the context window) is a ``ValueError``,
``TypeError``, ``OSError`` or ``ImportError`` by the time it reaches here: it gets
``error: ...`` and exit code 2, like argparse's own usage errors. Anything else is a bug
and gets ``internal error: ...`` and exit code 1. ``--debug`` shows the traceback instead,
for both.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130
USER_ERRORS = (ValueError, TypeError, OSError, ImportError)
DEBUG_FLAG = "--debug"


class OneLineParser(argparse.ArgumentParser):
    """``ArgumentParser`` whose usage errors are one line (the usage is one ``--help``
    away); subcommands made with ``add_subparsers`` inherit the class."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of the message, or the exception's type when it has none."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def exit_code(exc: SystemExit) -> int:
    """``sys.exit(code)`` as a return value (``None`` is 0, a message is 2 after printing)."""
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    print(exc.code, file=sys.stderr)
    return EXIT_USAGE


def run_guarded(action: Callable[[], int | None], debug: bool = False) -> int:
    """``action()``'s exit code; an exception becomes one stderr line and 2 (a user's
    mistake) or 1 (a bug), or propagates with its traceback when ``debug``."""
    try:
        return int(action() or 0)
    except SystemExit as exc:
        return exit_code(exc)
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug: still no traceback unless asked
        if debug:
            raise
        print(f"internal error: {type(exc).__name__}: {first_line(exc)} (run with "
              f"{DEBUG_FLAG} for the traceback)", file=sys.stderr)
        return EXIT_BUG


def split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (accepted anywhere on the line), and whether it was
    there; ``--`` ends the options, so a question ``--debug`` after it is kept."""
    if "--" in argv:
        cut = argv.index("--")
        head, tail = argv[:cut], argv[cut:]
    else:
        head, tail = argv, []
    return [a for a in head if a != DEBUG_FLAG] + tail, DEBUG_FLAG in head
