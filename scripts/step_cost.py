"""Does a tree step cost more than a chain step of the same size?

On Spec-Bench RAG prompts of at least ``--min-prompt`` tokens, answers each prompt with
``method="chain"`` and ``method="trie"`` (interleaved, the same generator and budget
type), and times every step's three engine seams: building the positions and the
ancestor mask (``EagerEngine.prepare``), the forward (``EagerEngine.run``) and the KV compaction
to the accepted path (``EagerEngine.commit``). Prints, per method and number of draft nodes,
the median of each, then per method the whole step (decode time per step, drafting
included) beside the accepted length.

    python scripts/step_cost.py --limit 40 --max-new-tokens 128 --threads 1

The seams are wrapped to read the clock around them; what they compute is unchanged.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.util.cache_paths import data_dir

DATA = data_dir()
METHODS = ("chain", "trie")
SEAMS = ("prepare", "run", "commit")


def timed(engine: Any, record: Callable[[str, float, Any], None]) -> None:
    """Wrap the engine's per-step seams so each call reports its wall time."""
    for name in SEAMS:
        real = getattr(engine, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name) -> Any:
            start = time.perf_counter()
            out = _real(*args)
            record(_name, time.perf_counter() - start, args)
            return out

        setattr(engine, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA / "spec_bench" / "rag.jsonl"))
    ap.add_argument("--limit", type=int, default=40, help="rows read (long ones kept)")
    ap.add_argument("--min-prompt", type=int, default=750, help="prompt tokens at least")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = SpeculativeGenerator.from_pretrained(dtype="float32")
    with open(args.data) as f:
        rows = [json.loads(line) for _, line in zip(range(args.limit), f, strict=False)]
    prompts = [gen.encode_prompt([{"role": "user", "content": r["turns"][0]}]) for r in rows]
    prompts = [p for p in prompts if len(p) >= args.min_prompt]
    if not prompts:
        raise SystemExit(f"no prompt of {args.min_prompt}+ tokens in the first {args.limit} rows")

    method = {"now": "warm-up"}
    step: dict[str, float] = {}
    seams: dict[tuple[str, int], list[tuple[float, float, float]]] = defaultdict(list)

    def record(name: str, seconds: float, call_args: tuple) -> None:
        step[name] = seconds
        if name == "run":
            step["nodes"] = call_args[1].drafted
        if name == "commit":
            seams[method["now"], int(step["nodes"])].append(
                (step["prepare"], step["run"], step["commit"]))

    timed(gen.engine, record)
    _ = gen.latency_curve
    gen.generate(prompts[0], max_new_tokens=8)  # warm-up, not reported
    totals: dict[str, dict[str, float]] = {m: defaultdict(float) for m in METHODS}
    for i, ids in enumerate(prompts):
        for name in METHODS[i % 2:] + METHODS[: i % 2]:  # order rotated per prompt
            method["now"] = name
            res = gen.generate(ids, method=name, max_new_tokens=args.max_new_tokens)
            t, s = totals[name], res.stats
            t["steps"] += s.steps
            t["tokens"] += sum(s.accept_lengths)
            t["decode_s"] += s.decode_s
            t["draft_s"] += s.draft_s
            t["nodes"] += s.drafted

    print(f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {args.max_new_tokens} new tokens, {args.threads} thread(s)\n")
    print(f"{'method':6} {'nodes':>5} {'steps':>5} {'prepare ms':>10} {'forward ms':>10} "
          f"{'compact ms':>10}")
    for (name, nodes), rows_ in sorted(seams.items()):
        if name == "warm-up":
            continue
        med = np.median(np.array(rows_), axis=0) * 1000
        print(f"{name:6} {nodes:5d} {len(rows_):5d} {med[0]:10.2f} {med[1]:10.1f} {med[2]:10.3f}")
    print(f"\n{'method':6} {'steps':>5} {'accept':>6} {'nodes/step':>10} {'ms/step':>8} "
          f"{'draft ms/step':>13}")
    for name in METHODS:
        t = totals[name]
        n = max(t["steps"], 1)
        print(f"{name:6} {int(t['steps']):5d} {t['tokens'] / n:6.2f} {t['nodes'] / n:10.2f} "
              f"{1000 * t['decode_s'] / n:8.1f} {1000 * t['draft_s'] / n:13.2f}")


if __name__ == "__main__":
    main()
