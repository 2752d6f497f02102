"""``bench`` and ``sweep`` subcommands: flags -> config -> run -> JSON, table, charts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ..bench.config import CONSTRAINED_METHODS, METHODS, TREE_METHODS, BenchConfig, SweepConfig
from ..bench.data import EXPECTED_SHAPES, DataFormatError
from ..bench.report import bench_table, sweep_tables, write_json
from ..engine.engine_names import ENGINES, MIN_CAPACITY
from .arguments import add_model_flags, add_quantize_flag, capacity_positions, int_list


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, metavar="FILE.jsonl",
                   help="JSONL (or .jsonl.gz) rows, one of: " + "; ".join(EXPECTED_SHAPES))
    p.add_argument("--limit", type=int, default=None, metavar="N", help="use the first N rows")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N",
                   help="new tokens per answer, at most (default: %(default)s)")
    add_model_flags(p, dtype_default="float32")
    add_quantize_flag(p)
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch.set_num_threads for every method (default: torch's choice)")
    p.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="unrecorded warm-up rounds, one short generation per method each "
                        "(default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--calibrate", action="store_true",
                   help="measure the model's latency curve first (about half a minute on "
                        "two cores; see ngram-trie-rag calibrate), so the engine runs its "
                        "fastest measured variants")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="what runs the speculative methods' forwards: eager (the buffered "
                        "cache and the CPU fast paths), static (a preallocated cache, trees "
                        "padded to fixed sizes), compiled (static, torch.compile and CUDA "
                        "graphs; each prompt's shapes compiled before it is timed, the "
                        "seconds reported as compile_s), uniform (static, every step 32 "
                        "nodes: bf16 methods almost always agree), uniform-compiled, "
                        "auto (the engine's own choice for the device; default)")
    p.add_argument("--capacity", type=capacity_positions, default=None, metavar="N",
                   help=f"cache positions (at least {MIN_CAPACITY}) a preallocating engine "
                        "(any but eager) reserves and compiles for (default: the engine's "
                        "own; the static engines reserve the longest prompt's)")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="run N CPU-spinning processes beside the whole run, to measure "
                        "on a busy host (default 0)")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench`` and ``sweep`` on an ``add_subparsers()`` object."""
    bench = subparsers.add_parser(
        "bench", help="compare decoding methods: speed, accept length, exactness",
        description="Run every method on every prompt (interleaved, greedy, same model) "
                    "and report tokens/s, speed-up vs vanilla greedy, accept lengths, "
                    "share of the oracle ceiling and exact-match rate.")
    _model_flags(bench)
    bench.add_argument("--methods", default=None, metavar="LIST",
                       help=f"comma-separated subset of {','.join(METHODS)} (default: all; "
                            "under --grammar: plain,chain,trie), and "
                            "trie@K / chain@K for a drafter with K nodes pinned per step "
                            "(vanilla always runs: it is the reference); hf-static "
                            "(generate over a static cache, compiled by Transformers on a "
                            "GPU) runs only when named")
    bench.add_argument("--n", type=int, default=13, metavar="N",
                       help="trie window n (default: %(default)s)")
    bench.add_argument("--prefix-len", type=int, default=3, metavar="L",
                       help="trie prefix length L_p (default: %(default)s)")
    bench.add_argument("--num-draft", type=int, default=None, metavar="K",
                       help="pin the draft budget to K nodes per step (default: the "
                            "generator's own setting)")
    bench.add_argument("--pld-num-tokens", type=int, default=10, metavar="N",
                       help="hf-pld prompt_lookup_num_tokens (default: %(default)s)")
    bench.add_argument("--pld-max-ngram", type=int, default=3, metavar="N",
                       help="hf-pld max_matching_ngram_size (default: %(default)s)")
    bench.add_argument("--grammar", default=None, metavar="NAME|SCHEMA.json",
                       help="a structured task: every method decodes under this grammar "
                            "(cited-json: answer + quote; json; or a JSON-schema file), "
                            "compared with constrained plain greedy")
    bench.add_argument("--repetition-stop", type=int, default=None, metavar="N",
                       help="every method ends its answer just before the first n-gram "
                            "(N tokens, N >= 2) that already occurred in it: loops are cut "
                            "alike for all methods (default: off)")
    bench.add_argument("--out", required=True, metavar="results.json")
    bench.add_argument("--plot", default=None, metavar="DIR", help="also write PNG charts here")
    bench.set_defaults(func=cmd_bench)

    sweep = subparsers.add_parser(
        "sweep", help="tree drafter over an n x L_p x num_draft grid",
        description="Vanilla greedy once per prompt, then the tree drafter per cell: an "
                    "n x L_p grid at --fixed-num-draft and a num_draft row at "
                    "(--fixed-n, --fixed-prefix-len). --replay derives accept lengths from "
                    "vanilla's answers without running the model per cell.")
    _model_flags(sweep)
    sweep.add_argument("--n", type=int_list, default=(8, 10, 13, 16), metavar="LIST",
                       help="window sizes n, comma-separated (default: 8,10,13,16)")
    sweep.add_argument("--prefix-len", type=int_list, default=(2, 3, 4, 5), metavar="LIST",
                       help="prefix lengths L_p, comma-separated (default: 2,3,4,5)")
    sweep.add_argument("--num-draft", type=int_list, default=(8, 16, 32, 64, 128, 256),
                       metavar="LIST",
                       help="draft budgets, comma-separated (default: 8,16,32,64,128,256)")
    sweep.add_argument("--fixed-n", type=int, default=13, metavar="N",
                       help="n of the num_draft row (default: %(default)s)")
    sweep.add_argument("--fixed-prefix-len", type=int, default=3, metavar="L",
                       help="L_p of the num_draft row (default: %(default)s)")
    sweep.add_argument("--fixed-num-draft", type=int, default=8, metavar="K",
                       help="num_draft of the n x L_p grid (default: %(default)s)")
    sweep.add_argument("--method", choices=TREE_METHODS, default="trie",
                       help="tree drafter: trie (the paper's) or backoff (default: trie)")
    sweep.add_argument("--replay", action="store_true",
                       help="accept lengths only, replayed against vanilla's answers")
    sweep.add_argument("--out", required=True, metavar="sweep.json")
    sweep.set_defaults(func=cmd_sweep)


def _common(args: argparse.Namespace) -> dict:
    return {"data": args.data, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "model": args.model, "dtype": args.dtype, "device": args.device,
            "threads": args.threads, "warmup": args.warmup,
            "background_load": args.background_load, "calibrate": args.calibrate,
            "engine": args.engine, "capacity": args.capacity, "quantization": args.quantize}


def bench_config(args: argparse.Namespace) -> BenchConfig:
    """Parsed ``bench`` flags -> :class:`BenchConfig`."""
    methods = args.methods
    if methods is None:  # every method, or under a grammar those that can decode under one
        methods = CONSTRAINED_METHODS if args.grammar else METHODS
    return BenchConfig(**_common(args), methods=methods, n=args.n,
                       prefix_len=args.prefix_len, num_draft=args.num_draft,
                       pld_num_tokens=args.pld_num_tokens, pld_max_ngram=args.pld_max_ngram,
                       grammar=args.grammar, repetition_stop=args.repetition_stop)


def sweep_config(args: argparse.Namespace) -> SweepConfig:
    """Parsed ``sweep`` flags -> :class:`SweepConfig`."""
    return SweepConfig(**_common(args), ns=args.n, prefix_lens=args.prefix_len,
                       num_drafts=args.num_draft, fixed_n=args.fixed_n,
                       fixed_prefix_len=args.fixed_prefix_len,
                       fixed_num_draft=args.fixed_num_draft, replay=args.replay,
                       method=args.method)


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.plots import write_plots
    from ..bench.runner import run_benchmark

    def report(results: dict) -> None:
        path = write_json(results, args.out)  # saved before anything is printed
        print(bench_table(results))
        print(f"results: {path}")
        if args.plot:
            for png in write_plots(results, args.plot):
                print(f"chart: {png}")

    return _run(lambda: bench_config(args), run_benchmark, report, args)


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..bench.sweep import run_sweep

    def report(doc: dict) -> None:
        path = write_json(doc, args.out)
        print(sweep_tables(doc))
        print(f"results: {path}")

    return _run(lambda: sweep_config(args), run_sweep, report, args)


def _run(config: Callable[[], Any], run: Callable[..., dict], report: Callable[[dict], None],
         args: argparse.Namespace) -> int:
    """Flags -> config -> run -> report; a mistake in the input is one line and exit 2."""
    from ..bench.background_load import background_load
    from ..loading import ModelNotFoundError

    try:
        cfg = config()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with background_load(cfg.background_load):
            results = run(cfg, _with_capacity(cfg), progress=not args.no_progress)
    except (DataFormatError, FileNotFoundError, ModelNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report(results)
    return 0



def _with_capacity(cfg: Any) -> Any:
    """The generator of a run whose engine has a fixed ``capacity`` (``None``: the runner
    loads its own, sized as it reserves): loaded here with it, after the thread count is
    set, as the runner would."""
    if cfg.capacity is None:
        return None
    import torch

    from ..generator import SpeculativeGenerator

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return SpeculativeGenerator.from_pretrained(cfg.model, device=cfg.device, dtype=cfg.dtype,
                                                engine=cfg.engine, capacity=cfg.capacity,
                                                quantization=cfg.quantization)
