"""Where one decode step's time goes: forward, drafting, mask, acceptance, KV compaction,
budget, trie extend. Wraps the generator's building blocks with timers and runs the
default model on Spec-Bench RAG prompts.

    python scripts/profile_step.py --data ../shared/data/spec_bench/rag.jsonl --limit 5
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable

import torch

import ngram_trie_rag.generator as generator_module
from ngram_trie_rag import NGramTrie, SpeculativeGenerator
from ngram_trie_rag.budget import DraftBudget
from ngram_trie_rag.proposers import PROPOSERS

TOTALS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def timed(name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[name] += time.perf_counter() - start
            CALLS[name] += 1
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/spec_bench/rag.jsonl")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    gen = SpeculativeGenerator.from_pretrained(dtype=args.dtype)
    rows = [json.loads(line) for line in open(args.data)][: args.limit]
    prompts = [[{"role": "user", "content": r["turns"][0]}] for r in rows]
    gen.generate(prompts[0], max_new_tokens=8)  # warm-up and latency curve

    PROPOSERS["trie"] = timed("draft (trie lookup + subtree)", PROPOSERS["trie"])
    generator_module.tree_inputs = timed("tree mask + positions", generator_module.tree_inputs)
    generator_module.accept = timed("acceptance walk (+device sync)", generator_module.accept)
    generator_module.compact = timed("KV compaction", generator_module.compact)
    NGramTrie.extend = timed("trie extend", NGramTrie.extend)
    DraftBudget.choose = timed("budget choose", DraftBudget.choose)
    DraftBudget.observe = timed("budget observe", DraftBudget.observe)
    # The steps' forwards (Llama step or modules); prefill calls the model directly.
    generator_module.forward = timed("model forward", generator_module.forward)

    decode = steps = tokens = 0.0
    for p in prompts:
        res = gen.generate(p, max_new_tokens=args.max_new_tokens)
        decode += res.stats.decode_s
        steps += res.stats.steps
        tokens += len(res.token_ids)
    print(f"{len(prompts)} prompts, {int(tokens)} tokens, {int(steps)} steps, "
          f"decode {decode:.2f} s ({1000 * decode / steps:.2f} ms/step), "
          f"threads {torch.get_num_threads()}, {args.dtype}")
    print(f"{'component':34s} {'ms/step':>8s} {'share':>7s}")
    for name, total in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
        print(f"{name:34s} {1000 * total / steps:8.3f} {100 * total / decode:6.2f}%")
    rest = decode - sum(TOTALS.values())
    print(f"{'other (Python loop, detokenising)':34s} {1000 * rest / steps:8.3f} "
          f"{100 * rest / decode:6.2f}%")


if __name__ == "__main__":
    main()
