"""How far a drafter is from what copying can give, from a benchmark's own answers.

Greedy answers are deterministic, so a ``results.json`` written by ``ngram-trie-rag
bench`` (it stores every prompt's plain greedy ``reference_ids``) is enough to replay
drafters without the model. For each data set this prints, per decode step pooled:

- ``oracle``: the best continuation after any earlier occurrence of the last token in
  prompt + answer, any depth (the harness's ``oracle_accept_length``);
- ``clairvoyant trie``: a selector that knows the answer and verifies exactly the right
  path among the trie's candidates (the back-off union below the match, 64 nodes,
  depth <= n - 1): the best any ranking of those candidates can do;
- ``trie, num_draft K``: the paper's draft (the longest match's subtree) at fixed
  budgets (``--budgets``, default 8, 16, 32, 64): what a fixed tree of K nodes accepts,
  without the adaptive budget's trade of accepted length for speed, beside the oracle
  with at most K draft tokens per step (the best any selection of K nodes can do);
- the run's measured ``trie`` (and ``plain``) figures, for comparison.

With ``--latency`` the model's latency curve is measured (as the generator measures it)
and each selector's steps are costed with it: decode time relative to plain one-token
steps, an estimate that ignores drafting overheads, not a measurement. It then also
replays ``chain`` and ``trie`` with the generator's adaptive budget, and with the tree
size chosen in hindsight at every step (the K that pays best knowing the answer): how
much any budget over each ranking could still gain.

    python scripts/ceiling.py docs/results/rag-bf16.json --latency
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.data import load_items
from ngram_trie_rag.bench.runner import encode_item
from ngram_trie_rag.bench.sweep import replay_cell
from ngram_trie_rag.drafting.budget import DraftBudget
from ngram_trie_rag.drafting.oracle import (
    hindsight_accept_lengths,
    oracle_accept_lengths,
    replay_accept_lengths,
)

CANDIDATES = 64


def clairvoyant_steps(gen: SpeculativeGenerator, ids: list[int], docs: list[list[int]] | None,
                      answer: list[int], max_new_tokens: int) -> list[int]:
    """Accept lengths when every step verifies exactly the true path among the trie's
    candidates: the replay of the back-off union with ``CANDIDATES`` nodes (the
    generator's trie, extended with the answer as it is produced)."""
    drafter = gen.drafter(ids, docs, "backoff", num_draft=CANDIDATES)
    return replay_accept_lengths(drafter, answer, max_new_tokens)


def costed(steps: list[int], cost: Callable[[int], float] | None,
           oracle: float | None = None, drafted: list[int] | None = None) -> str:
    """Mean accept length (and its share of ``oracle``), and with a cost curve the
    decode speed over plain steps. ``drafted``: nodes verified per step (default
    ``a - 1`` for a step that accepted ``a``: exactly the right path)."""
    al = sum(steps) / len(steps)
    line = f"AL {al:.3f}" + (f" ({al / oracle:.0%} of the oracle)" if oracle else "")
    if cost is None:
        return line
    nodes = drafted if drafted is not None else [a - 1 for a in steps]
    speed = sum(steps) * cost(0) / sum(cost(k) for k in nodes)
    return f"{line}, est. {speed:.2f}x plain"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="a results.json from ngram-trie-rag bench")
    parser.add_argument("--latency", action="store_true",
                        help="measure the latency curve and estimate speeds")
    parser.add_argument("--budgets", default="8,16,32,64",
                        help="fixed num_draft values to replay the paper's draft at")
    args = parser.parse_args()
    budgets = [int(k) for k in args.budgets.split(",") if k.strip()]

    doc = json.loads(args.results.read_text())
    meta = doc["meta"]
    gen = SpeculativeGenerator.from_pretrained(dtype=meta["dtype"])
    items = load_items(meta["data"], meta["rows_used"])
    cost = None
    if args.latency:
        cost = DraftBudget(dict(gen.latency_curve.seconds), CANDIDATES).cost
    oracle, clairvoyant = [], []
    # the paper's draft pinned at K nodes: in exact greedy decoding, the steps the
    # generator takes with that budget (replayed, with each step's node count)
    pinned = {k: gen.reshaped(num_draft=k) for k in budgets}
    fixed: dict[int, list[int]] = {k: [] for k in budgets}
    bound: dict[int, list[int]] = {k: [] for k in budgets}
    fixed_nodes: dict[int, list[int]] = {k: [] for k in budgets}
    # with a cost curve, per method: the adaptive budget replayed, and the size chosen
    # in hindsight
    sized_methods = ("chain", "trie") if cost is not None else ()
    sized = {(m, how): ([], []) for m in sized_methods for how in ("budget", "hindsight")}
    adaptive = {m: gen.reshaped() for m in sized_methods}  # a budget each
    for item, record in zip(items, doc["prompts"], strict=True):
        ids = encode_item(gen, item)
        if len(ids) != record["prompt_tokens"]:
            raise SystemExit(f"prompt {record['id']}: {len(ids)} tokens here, "
                             f"{record['prompt_tokens']} in the results: another tokenizer?")
        answer = record["reference_ids"]
        docs = gen.encode_documents(item.documents) if item.documents else None
        oracle += oracle_accept_lengths(ids, answer)
        clairvoyant += clairvoyant_steps(gen, ids, docs, answer, meta["max_new_tokens"])
        for k in budgets:
            fixed[k] += replay_cell(pinned[k], ids, docs, answer, meta["max_new_tokens"],
                                    drafted=fixed_nodes[k])
            bound[k] += oracle_accept_lengths(ids, answer, max_draft=k)
        for m in sized_methods:
            steps, nodes = sized[m, "budget"]
            steps += replay_accept_lengths(adaptive[m].drafter(ids, docs, m), answer,
                                           meta["max_new_tokens"], nodes)
            steps, nodes = sized[m, "hindsight"]
            fresh = partial(gen.drafter, ids, docs, m, num_draft=gen.config.num_draft)
            steps += hindsight_accept_lengths(fresh, answer, cost, meta["max_new_tokens"],
                                              nodes)
    runs = doc["methods"]
    print(f"{meta['data']} ({meta['rows_used']} prompts, {meta['dtype']})")
    ceiling = sum(oracle) / len(oracle)
    print(f"  oracle (copy from any occurrence, any depth): {costed(oracle, cost)}")
    print(f"  clairvoyant selection of the trie's candidates: "
          f"{costed(clairvoyant, cost, ceiling)}")
    for k in budgets:
        print(f"  trie, num_draft {k}: {costed(fixed[k], cost, ceiling, fixed_nodes[k])}; "
              f"oracle with at most {k} draft tokens: {costed(bound[k], None, ceiling)}")
    for (m, how), (steps, nodes) in sized.items():
        print(f"  {m}, {'adaptive budget' if how == 'budget' else 'size chosen in hindsight'}"
              f": {costed(steps, cost, ceiling, nodes)}, {sum(nodes) / len(nodes):.1f} "
              f"nodes/step")
    trie = runs["trie"]
    line = (f"  measured trie: AL {trie['mean_accept_length']:.3f} "
            f"({trie['oracle_share']:.0%} of the oracle)")
    if "plain" in runs:
        speed = trie["decode_tokens_per_s"] / runs["plain"]["decode_tokens_per_s"]
        line += f", {speed:.2f}x plain (decode tokens/s)"
    print(line)


if __name__ == "__main__":
    main()
