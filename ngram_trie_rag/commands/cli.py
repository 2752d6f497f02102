"""The ``ngram-trie-rag`` command line.

Every subcommand ends the same way on an error: one line on stderr and exit code 2 for a
user's mistake, a traceback only with ``--debug`` (see ``errors``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import DEBUG_FLAG, OneLineParser, exit_code, run_guarded, split_debug


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ngram-trie-rag",
        description="Lossless RAG speed-up with n-gram trie speculative decoding.",
    )
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {_version()}")
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="show the traceback of an error (accepted anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True)
    # Imported when the parser is built, not with this module: the subcommands pull in
    # the benchmark harness (torch).
    from . import ask, bench, bench_serve, calibrate, demo, index, serve

    for command in (demo, ask, index, calibrate, bench, bench_serve, serve):  # --help order
        command.add_parser(sub)
    return parser


def _version() -> str:
    """The installed distribution's version (the source tree's when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ngram-trie-rag")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (usage errors included, no ``SystemExit``)."""
    argv, debug = split_debug(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed in one line
        return exit_code(exc)
    args.debug = debug or args.debug  # handlers that catch errors themselves read it too
    return run_guarded(lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
