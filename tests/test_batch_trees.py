"""Per-row tree shares of a batched step: only nodes that pay for their cost are kept."""

from __future__ import annotations

import numpy as np

from ngram_trie_rag.drafting.batch_trees import TreeShares

CHANCES = [np.array([0.9, 0.6, 0.2]), np.array([0.3]), np.array([0.8, 0.1])]


def _fitted(a: float, b: float) -> TreeShares:
    """Shares whose cost has seen steps of ``a + b * N`` seconds, N varied."""
    shares = TreeShares(explore_every=1000)
    for lengths in ([0, 0, 0], [3, 1, 2], [1, 0, 0], [2, 1, 1], [3, 0, 2], [0, 1, 0],
                    [1, 1, 1], [2, 0, 2], [3, 1, 0], [0, 0, 2]):
        shares.observe(lengths, a + b * (3 + sum(lengths)))
    return shares


def test_until_the_cost_is_known_each_row_keeps_a_random_share() -> None:
    shares = TreeShares(seed=1)
    for _ in range(20):
        kept = shares.lengths(CHANCES)
        assert all(0 <= k <= len(c) for k, c in zip(kept, CHANCES, strict=True))
    assert shares.cost.fit() is None


def test_a_compute_bound_step_keeps_only_likely_nodes() -> None:
    # a CPU with a dozen rows: a query costs a third of the fixed part per row
    assert _fitted(a=0.030, b=0.004).lengths(CHANCES) == [2, 0, 1]


def test_a_step_of_fixed_cost_keeps_whole_trees() -> None:
    # a GPU: a few more queries cost next to nothing
    assert _fitted(a=0.030, b=1e-6).lengths(CHANCES) == [3, 1, 2]


def test_where_every_query_costs_alike_no_tree_pays() -> None:
    assert _fitted(a=0.0, b=0.004).lengths(CHANCES) == [0, 0, 0]
