"""Do ``chain`` and ``trie`` give plain decoding's tokens through one engine, in one dtype?

In fp32 they must (greedy exactness). In bf16 a row's logits can depend on the shape of
the forward it shares, so through the eager engine the drafting methods may part from
plain decoding at a near-tie; through ``--engine uniform`` (one step shape) they should
not. Prints, per prompt, whether each method's tokens equal plain decoding's and where
they first differ, then the count of prompts where all three agree.

    .venv/bin/python scripts/method_agreement.py --engine uniform --dtype bfloat16 --limit 8
    python scripts/method_agreement.py --model M.gguf --device cuda \
        --engine uniform-compiled --limit 40 --max-new-tokens 64 --generate --out agree.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.data import load_items
from ngram_trie_rag.bench.methods import run_vanilla
from ngram_trie_rag.bench.runner import warm_up
from ngram_trie_rag.util.cache_paths import data_dir

DATA = data_dir() / "spec_bench" / "rag.jsonl"
METHODS = ("none", "chain", "trie")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` part (None: identical)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def agreement(gen: SpeculativeGenerator, data: str | Path, limit: int, skip: int = 0,
              max_new_tokens: int = 32, generate: bool = False) -> dict:
    """Per prompt, where ``chain`` and ``trie`` part from plain decoding (and, with
    ``generate``, which methods equal ``model.generate(do_sample=False)``), and totals.
    A compiled engine first sizes one cache for every prompt and compiles its shapes,
    so no answer waits for a compile and the compile time is reported apart."""
    items = load_items(data, limit=limit)[skip:]
    requests = [item.request(gen.tokenizer) for item in items]
    compile_s = warm_up(gen, [gen.encode_prompt(r.prompt) for r in requests],
                                    max_new_tokens)
    if compile_s:
        print(f"compiled the step shapes in {compile_s:.1f} s", flush=True)
    rows, agree, with_generate = [], 0, dict.fromkeys(METHODS, 0)
    for item, request in zip(items, requests, strict=True):
        tokens, parts, line = {}, {}, []
        for method in METHODS:
            start = time.perf_counter()
            result = gen.generate(request.prompt, documents=item.documents, method=method,
                                  max_new_tokens=max_new_tokens, repetition_stop=None)
            tokens[method] = result.token_ids
            parts[method] = first_difference(result.token_ids, tokens["none"])
            verdict = "same" if parts[method] is None else f"differs at {parts[method]}"
            line.append(f"{method}: {verdict} ({time.perf_counter() - start:.1f} s, "
                        f"accepted {result.stats.mean_accept_length:.2f})")
        agree += all(t == tokens["none"] for t in tokens.values())
        row = {"id": item.id, "parts_from_plain": parts}
        if generate:
            reference = run_vanilla(gen, gen.encode_prompt(request.prompt), max_new_tokens,
                                    0.0).token_ids
            row["equal_to_generate"] = same = [m for m in METHODS if tokens[m] == reference]
            for m in same:
                with_generate[m] += 1
            line.append(f"equal to generate: {', '.join(same) or 'no method'}")
        rows.append(row)
        print(f"{item.id}: " + "; ".join(line), flush=True)
    summary = {"prompts": len(items), "all_three_agree": agree, "compile_s": compile_s,
               "max_new_tokens": max_new_tokens, "rows": rows}
    print(f"all three methods agree on {agree} of {len(items)} prompts")
    if generate:
        summary["equal_to_generate"] = with_generate
        print("equal to generate: " + ", ".join(f"{m} {n} of {len(items)}"
                                                 for m, n in with_generate.items()))
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the packaged model")
    p.add_argument("--device", default=None, help="default: CUDA when available, else CPU")
    p.add_argument("--engine", default="uniform")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--skip", type=int, default=0, help="leave out the first N of those rows")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--generate", action="store_true",
                   help="also compare every method with model.generate(do_sample=False)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = SpeculativeGenerator.from_pretrained(args.model, device=args.device,
                                               dtype=args.dtype, engine=args.engine)
    summary = agreement(gen, args.data, args.limit, args.skip, args.max_new_tokens,
                        args.generate)
    summary |= {"engine": args.engine, "dtype": args.dtype, "device": str(gen.model.device)}
    print(f"engine {args.engine}, {args.dtype}")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
