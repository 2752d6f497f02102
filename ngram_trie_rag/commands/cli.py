"""The ``ngram-trie-rag`` command line.

Every subcommand ends the same way on an error: one line on stderr and exit code 2 for a
user's mistake, a traceback only with ``--debug`` (see ``errors``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .arguments import positive_int
from .errors import DEBUG_FLAG, OneLineParser, exit_code, run_guarded, split_debug


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.question, args.max_new_tokens, args.dtype)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="ngram-trie-rag",
        description="Lossless RAG speed-up with n-gram trie speculative decoding.",
    )
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="show the traceback of an error (accepted anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="answer a question over the bundled documents")
    demo.add_argument("--question", default=None)
    demo.add_argument("--max-new-tokens", type=positive_int, default=128)
    demo.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    demo.set_defaults(func=_demo)
    from ..bench.cli import add_parser as add_bench
    from ..bench.serve import add_parser as add_bench_serve
    from ..retrieval.cli import add_parser as add_index
    from ..serving.server import add_parser as add_serve
    from .ask import add_parser as add_ask

    add_ask(sub)
    add_index(sub)
    add_bench(sub)
    add_bench_serve(sub)
    add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (usage errors included, no ``SystemExit``)."""
    argv, debug = split_debug(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed in one line
        return exit_code(exc)
    if args.command == "demo" and args.question is None:
        from .demo import DEFAULT_QUESTION

        args.question = DEFAULT_QUESTION
    args.debug = debug or args.debug  # handlers that catch errors themselves read it too
    return run_guarded(lambda: args.func(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
