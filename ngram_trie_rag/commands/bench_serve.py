"""``bench-serve`` subcommand: vLLM, vLLM n-gram and vLLM + trie, and the local server
without drafts and with the trie, at several concurrencies.

Flags -> :func:`~ngram_trie_rag.bench.serve.run_bench_serve` -> a Markdown table, and the
results JSON with ``--out``. ``--methods`` defaults to what can run here (vLLM's methods
where vLLM is installed, else the local ones); a vLLM method asked for where vLLM is
missing is refused before anything loads.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ..bench.serve import (
    METHODS,
    check_methods,
    check_quantization,
    default_methods,
    run_bench_serve,
    table,
)
from .arguments import add_quantize_flag, int_list


def _levels(text: str) -> list[int]:
    values = list(int_list(text))
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {text!r}")
    return values


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown methods {bad}; choose from {METHODS}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench-serve`` on an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "bench-serve", help="vLLM (plain, n-gram, trie) and the local server (plain, trie) "
                            "at several concurrencies",
        description="Benchmark vLLM without speculation, with its n-gram proposer and "
                    "with the trie proposer (vLLM must be installed here), and this "
                    "package's local OpenAI server without drafts and with the trie.")
    p.add_argument("--data", required=True, help="benchmark JSONL (Spec-Bench or context QA)")
    p.add_argument("--concurrency", type=_levels, default=[1, 4, 16])
    p.add_argument("--methods", type=_methods, default=None,
                   help=f"comma-separated, of {','.join(METHODS)} (default: "
                        f"{','.join(default_methods())}, what can run here)")
    p.add_argument("--limit", type=int, default=16, help="prompts (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--model", default=None,
                   help="a Hugging Face hub id or model folder (default: packaged model)")
    p.add_argument("--dtype", default="float32")
    add_quantize_flag(p)
    p.add_argument("--engine-args", type=json.loads, default=None,
                   help="JSON dict of vLLM engine arguments (default: small CPU limits; "
                        "the local methods take none)")
    p.add_argument("--out", default=None, help="write the results JSON here")
    p.set_defaults(func=cmd_bench_serve)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    if args.limit < 1 or args.max_new_tokens < 1:
        raise SystemExit("error: --limit and --max-new-tokens must be >= 1")
    methods = args.methods or default_methods()
    check_quantization(methods, args.quantize)  # before the data and the model load
    check_methods(methods)
    doc = run_bench_serve(args.data, methods=args.methods, concurrency=args.concurrency,
                          limit=args.limit, max_new_tokens=args.max_new_tokens,
                          num_speculative_tokens=args.num_speculative_tokens,
                          model=args.model, dtype=args.dtype, quantization=args.quantize,
                          engine_args=args.engine_args,
                          command="ngram-trie-rag " + shlex.join(sys.argv[1:]))
    print(table(doc["results"]))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2))
        print(f"wrote {args.out}")
    return 0
