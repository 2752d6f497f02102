"""The ``ngram-trie-rag`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.question, args.max_new_tokens, args.dtype)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ngram-trie-rag",
        description="Lossless RAG speed-up with n-gram trie speculative decoding.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="answer a question over the bundled documents")
    demo.add_argument("--question", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=128)
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
    args = build_parser().parse_args(argv)
    if args.command == "demo" and args.question is None:
        from .demo import DEFAULT_QUESTION

        args.question = DEFAULT_QUESTION
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
