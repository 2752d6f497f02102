"""``ngram-trie-rag cost-curve``: what verifying 1-128 draft tokens costs against one
plain step, chain against tree, at the model shapes users run (random weights, nothing
downloaded), and the decode speed-up that curve projects with oracle accepted lengths
from a benchmark run (``--oracle results.json``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .arguments import int_list


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..bench.cost_shapes import CONTEXTS, DRAFT_SIZES, SHAPES

    p = sub.add_parser("cost-curve", help="time per verification step against draft size, "
                       "and the projected speed-up",
                       description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="smollm2-135m,llama-3.2-1b,llama-3.1-8b,qwen2.5-7b",
                   help=f"comma-separated, of {','.join(SHAPES)} (default: %(default)s)")
    p.add_argument("--contexts", type=int_list, default=CONTEXTS, metavar="LIST",
                   help="tokens of context, comma-separated (default: 1024,2048,4096)")
    p.add_argument("--sizes", type=int_list, default=DRAFT_SIZES, metavar="LIST",
                   help="draft tokens K, comma-separated (default: 1,2,...,128)")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--oracle", type=Path, default=None, metavar="results.json",
                   help="a bench results file: its oracle accepted lengths per draft cap "
                        "give the projected speed-up (e.g. docs/results/rag-fp32.json)")
    p.add_argument("--out", type=Path, default=None, metavar="curve.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench import cost_curve, projection

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in cost_curve.SHAPES]
    if unknown or not shapes:
        raise ValueError(f"unknown shape(s) {unknown or shapes}; choose from "
                         f"{', '.join(cost_curve.SHAPES)}")
    if min(args.contexts) < 1 or min(args.sizes) < 1 or args.repeats < 1 or args.warmup < 0:
        raise ValueError("--contexts, --sizes and --repeats must be >= 1, --warmup >= 0")
    oracle = projection.read_oracle(args.oracle) if args.oracle else None
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    points = []
    for shape in shapes:
        print(f"cost-curve: {shape} on {device} ...", file=sys.stderr, flush=True)
        points += cost_curve.measure(shape, device=device, dtype=dtype,
                                     contexts=tuple(args.contexts), sizes=tuple(args.sizes),
                                     warmup=args.warmup, repeats=args.repeats)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(cost_curve.table(points))
    projected = projection.project(points, oracle) if oracle else []
    if projected:
        print()
        print(projection.table(projected))
    if args.out:
        doc = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
               "points": cost_curve.as_json(points),
               "oracle": {str(k): v for k, v in (oracle or {}).items()},
               "projection": projection.as_json(projected)}
        args.out.write_text(json.dumps(doc, indent=1))
        print(f"results: {args.out}", file=sys.stderr)
    return 0
