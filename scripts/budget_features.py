"""Would the draft budget gain from more features, another rule or another ranking?

Replays a ``ngram-trie-rag bench`` run's greedy answers (its ``reference_ids``) through
drafters whose budget differs from :class:`~ngram_trie_rag.drafting.budget.DraftBudget`
in one respect each, and prices every step with the model's latency curve, as
``scripts/ceiling.py --latency`` does (an estimate of decode speed over plain steps that
ignores drafting overheads, not a measurement):

- ``streak``: the acceptance table also keyed by how many draft tokens the request's
  previous step accepted (0, 1, 2-3, 4+): a request that is copying a span goes on;
- ``freq``: also keyed by the node's own count (1, 2, 3+), not only its share;
- ``rate``: K maximising ``gain - r * cost`` with ``r`` the budget's running tokens per
  second (the optimum for a known long-run rate) instead of ``gain / cost``;
- ``recent``: the newest occurrence's path ranked first, then the trie's ranking
  (prompt lookup's choice inside the paper's tree), its nodes a table of their own;

beside the budget as it is and the size chosen in hindsight (its ceiling). One budget
learns across the prompts of a run, as the generator's does. Rows ``--rows A:B`` of the
results (e.g. rows the bench's first ``--limit`` did not use, to tune without them).

    ngram-trie-rag bench --data ../shared/data/spec_bench/rag.jsonl --limit 40 \\
        --methods vanilla,trie --out rag40.json
    python scripts/budget_features.py rag40.json --rows 16:40
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.bench.data import load_items
from ngram_trie_rag.bench.runner import encode_item
from ngram_trie_rag.drafting.budget import MAX_MATCH_BUCKET, DraftBudget
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.drafting.drafter import Drafter
from ngram_trie_rag.drafting.oracle import hindsight_accept_lengths, replay_accept_lengths
from ngram_trie_rag.drafting.proposers import PROPOSERS
from ngram_trie_rag.drafting.trie import NGramTrie

STREAK_BINS = (1, 2, 4)  # draft tokens the previous step accepted: 0, 1, 2-3, 4+
FREQ_BINS = (2, 3)  # a node's count: 1, 2, 3+


class VariantBudget(DraftBudget):
    """The budget with optional extra table axes (streak, count, newest path) and rule."""

    def __init__(self, latency: dict[int, float], max_draft: int, *, streak: bool = False,
                 freq: bool = False, recent: bool = False, rule: str = "ratio") -> None:
        super().__init__(latency, max_draft)
        self.use_streak, self.use_freq, self.use_recent, self.rule = streak, freq, recent, rule
        extra = (len(STREAK_BINS) + 1, len(FREQ_BINS) + 1)
        # the match axis doubled: nodes on the newest occurrence's path learn apart
        self.accepted = np.concatenate([self.accepted] * 2)[..., None, None] * np.ones(extra)
        self.seen = np.concatenate([self.seen] * 2)[..., None, None] * np.ones(extra)
        self.streak = 0  # set by the request's drafter before each choose / observe
        self.tokens = self.seconds = 0.0  # emitted so far, and their cost on the curve
        self._chosen = 0

    def _buckets(self, tree: DraftTree) -> tuple[np.ndarray, ...]:
        match, depth, share = super()._buckets(tree)
        n = len(tree)
        if self.use_recent and tree.recency is not None and n:
            match = match + (1 + MAX_MATCH_BUCKET) * (tree.recency == tree.recency.max())
        streak = np.digitize(self.streak, STREAK_BINS) if self.use_streak else 0
        freq = np.digitize(tree.frequencies, FREQ_BINS) if self.use_freq else np.zeros(n, int)
        return match, depth, share, np.full(n, streak), freq

    def choose(self, tree: DraftTree) -> int:
        if self.rule == "ratio":
            self._chosen = super().choose(tree)
            return self._chosen
        n = min(len(tree), self.max_draft)
        if n == 0:
            return 0
        p = np.zeros(len(tree))
        p[tree.ranks()] = self.probabilities(tree)
        gain = 1.0 + np.concatenate(([0.0], np.cumsum(p[:n])))
        cost = np.array([self.cost(k) for k in range(n + 1)])
        rate = self.tokens / self.seconds if self.seconds else 1.0 / cost[0]
        self._chosen = int(np.argmax(gain - rate * cost))
        return self._chosen

    def observe(self, tree: DraftTree, emitted: Sequence[int]) -> None:
        super().observe(tree, emitted)
        self.tokens += len(emitted)
        self.seconds += self.cost(self._chosen)





class StreakDrafter(Drafter):
    """A drafter that tells its (variant) budget how its previous step went."""

    streak = 0

    def propose(self, room: int) -> DraftTree:
        self.budget.streak = self.streak
        return super().propose(room)

    def update(self, emitted: Sequence[int], step_seconds: float | None = None) -> None:
        stepped = self._pending is not None
        super().update(emitted, step_seconds)
        if stepped:
            self.streak = len(emitted) - 1


def newest_first(trie: NGramTrie, tail: Sequence[int], num_draft: int,
                 max_depth: int) -> DraftTree:
    """The paper's subtree with the newest occurrence's path ranked first (ancestor-
    closed: that path is one, and the rest keep the trie's order), recency kept."""
    full = trie.draft(tail, 1 << 30, max_depth)
    if not len(full):
        return full
    newest = full.recency == full.recency.max()
    rank = np.empty(len(full), dtype=np.int64)
    rank[np.lexsort((full.ranks(), ~newest))] = np.arange(len(full))
    keep = np.flatnonzero(rank < num_draft)
    remap = np.full(len(full), -1, dtype=np.int64)
    remap[keep] = np.arange(keep.size)
    parents = full.parents[keep]
    parents = np.where(parents >= 0, remap[np.maximum(parents, 0)], -1)
    return DraftTree(full.tokens[keep], parents, full.depths[keep], full.frequencies[keep],
                     full.match_len, full.recency[keep], rank[keep])


VARIANTS = {
    "as is": {},
    "streak": {"streak": True},
    "freq": {"freq": True},
    "rate": {"rule": "rate"},
    "rate+streak": {"rule": "rate", "streak": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, help="a results.json from ngram-trie-rag bench")
    parser.add_argument("--rows", default=":", help="rows A:B of the results (default: all)")
    args = parser.parse_args()
    lo, _, hi = args.rows.partition(":")
    doc = json.loads(args.results.read_text())
    meta = doc["meta"]
    gen = SpeculativeGenerator.from_pretrained(dtype=meta["dtype"])
    items = load_items(meta["data"], meta["rows_used"])
    rows = slice(int(lo or 0), int(hi or len(items)))
    pairs = list(zip(items, doc["prompts"], strict=True))[rows]
    prepared = []
    for item, record in pairs:
        docs = gen.encode_documents(item.documents) if item.documents else None
        prepared.append((encode_item(gen, item), docs, record["reference_ids"]))
    curve = dict(gen.latency_curve.seconds)
    cost = DraftBudget(curve, 64).cost
    PROPOSERS.setdefault("newest-first", newest_first)
    limit = meta["max_new_tokens"]

    def line(label: str, steps: list[int], nodes: list[int]) -> None:
        speed = sum(steps) * cost(0) / sum(cost(k) for k in nodes)
        print(f"  {label:28s} AL {np.mean(steps):.3f}, {np.mean(nodes):.2f} nodes/step, "
              f"est. {speed:.3f}x plain", flush=True)

    print(f"{meta['data']}, rows {args.rows} ({len(prepared)} prompts)")
    runs = [("trie", name, kw) for name, kw in VARIANTS.items()]
    runs += [("newest-first", "recent", {"recent": True})]
    runs += [("chain", name, kw) for name, kw in VARIANTS.items()]
    for method, name, kw in runs:
        budget = VariantBudget(curve, gen.config.num_draft, **kw)
        steps: list[int] = []
        nodes: list[int] = []
        for ids, docs, answer in prepared:
            drafter = StreakDrafter.for_request(gen.config, ids, docs, budget=budget,
                                                method=method)
            steps += replay_accept_lengths(drafter, answer, limit, nodes)
        line(f"{method}, {name}", steps, nodes)
    for method in ("trie", "chain"):
        steps, nodes = [], []
        for ids, docs, answer in prepared:
            fresh = partial(gen.drafter, ids, docs, method, num_draft=gen.config.num_draft)
            steps += hindsight_accept_lengths(fresh, answer, cost, limit, nodes)
        line(f"{method}, size in hindsight", steps, nodes)


if __name__ == "__main__":
    main()
