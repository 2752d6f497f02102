"""Where one decode step's time goes: drafting, preparing the forward, the forward, the
acceptance walk, KV compaction and the drafter's update, on Spec-Bench RAG prompts.

    python scripts/profile_step.py --data ../shared/data/spec_bench/rag.jsonl --limit 5

Timed with cProfile over the decode loop's own seams (``Drafter.propose``,
``EagerEngine.prepare``, ``EagerEngine.run``, ``host_walk``, ``EagerEngine.commit``,
``Drafter.update``):
nothing is patched, and a seam that is never called is an error, not a silent zero.
cProfile adds a little to every Python call, so read shares, not absolute times.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats

import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.util.cache_paths import data_dir

# label -> (file suffix, function name) of the seams the decode loop calls once per step
SEAMS = {
    "draft (Drafter.propose)": ("drafting/drafter.py", "propose"),
    "tree mask + positions (EagerEngine.prepare)": ("engine/eager.py", "prepare"),
    "model forward (EagerEngine.run)": ("engine/eager.py", "run"),
    "acceptance walk (+device sync)": ("ngram_trie_rag/engine/acceptance.py", "host_walk"),
    "KV compaction (EagerEngine.commit)": ("engine/eager.py", "commit"),
    "budget + trie learning (Drafter.update)": ("drafting/drafter.py", "update"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(data_dir() / "spec_bench" / "rag.jsonl"))
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    gen = SpeculativeGenerator.from_pretrained(dtype=args.dtype)
    with open(args.data) as f:
        rows = [json.loads(line) for line in f if line.strip()][: args.limit]
    prompts = [[{"role": "user", "content": r["turns"][0]}] for r in rows]
    gen.generate(prompts[0], max_new_tokens=8)  # warm-up and latency curve

    profile = cProfile.Profile()
    decode = steps = 0.0
    for p in prompts:
        profile.enable()
        res = gen.generate(p, max_new_tokens=args.max_new_tokens)
        profile.disable()
        decode += res.stats.decode_s
        steps += res.stats.steps
    totals = _seam_totals(pstats.Stats(profile))
    print(f"{len(prompts)} prompts, {int(steps)} steps, decode {decode:.2f} s "
          f"({1000 * decode / steps:.2f} ms/step), threads {torch.get_num_threads()}, "
          f"{args.dtype}")
    print(f"{'component':42s} {'ms/step':>8s} {'share':>7s}")
    for label, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{label:42s} {1000 * total / steps:8.3f} {100 * total / decode:6.2f}%")
    rest = decode - sum(totals.values())
    print(f"{'other (loop, detokenising, profiler)':42s} {1000 * rest / steps:8.3f} "
          f"{100 * rest / decode:6.2f}%")


def _seam_totals(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative seconds per seam; raises if a seam was never called."""
    totals: dict[str, float] = {}
    for label, (suffix, name) in SEAMS.items():
        hits = [cum for (file, _, func), (_, _, _, cum, _) in stats.stats.items()
                if file.endswith(suffix) and func == name]
        if not hits:
            raise SystemExit(f"{label}: {suffix}:{name} was never called; update SEAMS")
        totals[label] = sum(hits)
    return totals


if __name__ == "__main__":
    main()
