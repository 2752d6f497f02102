"""The ``ngram-trie-rag`` command line.

Every subcommand ends the same way on an error: one line on stderr and exit code 2 for a
user's mistake, a traceback only with ``--debug`` (see ``errors``).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
from collections.abc import Sequence

from .errors import DEBUG_FLAG, OneLineParser, exit_code, run_guarded, split_debug

# Commands that run long enough to compile, and show it: each step shape, with seconds.
PROGRESS_COMMANDS = ("bench", "calibrate", "chat", "serve")


def show_compile_progress() -> None:
    """The engine's compile progress (its log at INFO) on stderr, one line each."""
    import logging

    logger = logging.getLogger("ngram_trie_rag.engine")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("ngram-trie-rag: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


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
    from . import ask, bench, bench_serve, calibrate, cost_curve, demo, index, serve

    for command in (demo, ask, index, calibrate, bench, cost_curve, bench_serve,
                    serve):  # --help order
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


def main(argv: Sequence[str] | None = None, *, resident: bool = False) -> int:
    """Run one command; returns its exit code (usage errors included, no ``SystemExit``).

    ``resident``: ``ask`` runs in a worker that keeps the model loaded (``resident``)
    unless ``--keep-alive 0``. The console script asks for it; in-process callers (tests,
    notebooks) hold their own models and get none, so no call of theirs starts a process.
    """
    raw = list(sys.argv[1:] if argv is None else argv)
    argv, debug = split_debug(raw)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed in one line
        return exit_code(exc)
    args.debug = debug or args.debug  # handlers that catch errors themselves read it too
    if args.command in PROGRESS_COMMANDS:
        show_compile_progress()
    if resident and args.command == "ask":
        return run_guarded(lambda: _ask_resident(raw, args), debug=args.debug)
    return run_guarded(lambda: args.func(args), debug=args.debug)


def _ask_resident(raw: list[str], args: argparse.Namespace) -> int:
    """``ask`` in the worker for its model (``--keep-alive``), or here when that is 0."""
    from . import resident

    keep_alive = resident.keep_alive_seconds(None) if args.keep_alive is None \
        else args.keep_alive
    if keep_alive == 0 or not resident.AVAILABLE:
        return args.func(args)
    key = resident.worker_key(args.model, args.device, args.dtype, args.engine, args.capacity,
                              args.quantize)
    return resident.ask(raw, key, keep_alive, quiet=args.json)


def entry() -> None:
    """The console script: :func:`main`, then an exit that skips Python's teardown.

    Tearing down the module graph of torch and transformers takes 1-2 s on a small CPU,
    after the answer is printed and before the shell prompt returns, for nothing: a
    command's output is on its streams and its exit hooks have run. So: wait for the
    threads Python would wait for, run the exit hooks, flush, and leave. In-process
    callers (tests, notebooks) use :func:`main`, which returns.
    """
    code = main(resident=True)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # logging's shutdown among them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing left to say
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
