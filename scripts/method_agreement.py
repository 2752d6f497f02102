"""Do ``chain`` and ``trie`` give plain decoding's tokens through one engine, in one dtype?

In fp32 they must (greedy exactness). In bf16 a row's logits can depend on the shape of
the forward it shares, so through the eager engine the drafting methods may part from
plain decoding at a near-tie; through ``--engine uniform`` (one step shape) they should
not. Prints, per prompt, whether each method's tokens equal plain decoding's and where
they first differ, then the count of prompts where all three agree.

    .venv/bin/python scripts/method_agreement.py --engine uniform --dtype bfloat16 --limit 8
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.data import load_items
from ngram_trie_rag.bench.methods import run_vanilla

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "rag.jsonl"
METHODS = ("none", "chain", "trie")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="uniform")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--skip", type=int, default=0, help="leave out the first N of those rows")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--generate", action="store_true",
                   help="also compare every method with model.generate(do_sample=False)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = SpeculativeGenerator.from_pretrained(dtype=args.dtype, engine=args.engine)
    agree, with_generate = 0, dict.fromkeys(METHODS, 0)
    items = load_items(args.data, limit=args.limit)[args.skip:]
    for item in items:
        request = item.request(gen.tokenizer)
        tokens, line = {}, []
        for method in METHODS:
            start = time.perf_counter()
            result = gen.generate(request.prompt, documents=item.documents, method=method,
                                  max_new_tokens=args.max_new_tokens, repetition_stop=None)
            tokens[method] = result.token_ids
            plain = tokens["none"]
            first = next((i for i, (a, b) in enumerate(zip(result.token_ids, plain,
                                                           strict=False)) if a != b),
                         min(len(plain), len(result.token_ids)))
            verdict = "same" if result.token_ids == plain else f"differs at {first}"
            line.append(f"{method}: {verdict} ({time.perf_counter() - start:.1f} s, "
                        f"accepted {result.stats.mean_accept_length:.2f})")
        agree += all(t == tokens["none"] for t in tokens.values())
        if args.generate:
            reference = run_vanilla(gen, gen.encode_prompt(request.prompt),
                                    args.max_new_tokens, 0.0).token_ids
            same = [m for m in METHODS if tokens[m] == reference]
            for m in same:
                with_generate[m] += 1
            line.append(f"equal to generate: {', '.join(same) or 'no method'}")
        print(f"{item.id}: " + "; ".join(line), flush=True)
    print(f"engine {args.engine}, {args.dtype}: all three methods agree on {agree} of "
          f"{len(items)} prompts")
    if args.generate:
        print("equal to generate: " + ", ".join(f"{m} {n} of {len(items)}"
                                                 for m, n in with_generate.items()))


if __name__ == "__main__":
    main()
