"""The adaptive draft budget on hand-made trees and latency curves."""

from __future__ import annotations

import numpy as np

from ngram_trie_rag import DraftTree, NGramTrie
from ngram_trie_rag.drafting.budget import DraftBudget

FLAT = {q: 0.040 for q in range(1, 66)}  # verifying more is free (GPU, bf16)
STEEP = {q: 0.040 * q for q in range(1, 66)}  # every token costs a full step


def _tree() -> DraftTree:
    trie = NGramTrie(n=6, prefix_len=2)
    for doc in [[1, 2, 3, 4, 5]] * 3 + [[1, 2, 7, 8]]:
        trie.add_document(doc)
    return trie.draft([1, 2], num_draft=16)  # 3 4 5 (freq 3 each), 7 8 (freq 1)


def test_flat_latency_verifies_every_candidate() -> None:
    tree = _tree()
    assert DraftBudget(FLAT, max_draft=16).choose(tree) == len(tree)


def test_steep_latency_prefers_plain_steps() -> None:
    assert DraftBudget(STEEP, max_draft=16).choose(_tree()) == 0


def test_a_dear_curve_still_tries_a_draft_every_few_steps() -> None:
    """A curve that makes every draft look dear (timed on a busy host) would never see
    a draft step again to correct it: every EXPLORE_EVERY-th choice uses the prior's
    cost, and a draft step that turns out cheap brings the curve down at once."""
    from ngram_trie_rag.drafting.budget import EXPLORE_EVERY

    budget = DraftBudget(STEEP, max_draft=16)
    choices = [budget.choose(_tree()) for _ in range(2 * EXPLORE_EVERY)]
    explored = [i for i, k in enumerate(choices) if k]
    assert explored == [EXPLORE_EVERY - 1, 2 * EXPLORE_EVERY - 1]
    k = choices[explored[0]]
    budget.record_latency(1 + k, 0.045)  # the draft cost about a plain step
    assert budget.latency[1 + k] < STEEP[1 + k] / 2


def test_cap_and_empty_tree() -> None:
    assert DraftBudget(FLAT, max_draft=2).choose(_tree()) == 2
    assert DraftBudget(FLAT, max_draft=8).choose(DraftTree.empty()) == 0


def test_observe_labels_accepted_rejected_and_unknown() -> None:
    tree = _tree()  # pre-order: 3, 3-4, 3-4-5, 7, 7-8
    budget = DraftBudget(FLAT, max_draft=16)
    before_acc, before_seen = budget.accepted.copy(), budget.seen.copy()
    budget.observe(tree, [3, 4, 9])  # 3 and 4 accepted, 9 is the bonus: 5 rejected
    assert budget.seen.sum() - before_seen.sum() == len(tree)
    assert budget.accepted.sum() - before_acc.sum() == 2
    budget = DraftBudget(FLAT, max_draft=16)
    budget.observe(tree, [3, 4])  # the emitted tokens end on node 3-4: 3-4-5 is unknown
    assert budget.seen.sum() - before_seen.sum() == len(tree) - 1


def test_learning_moves_the_choice() -> None:
    """A curve where 3 nodes cost about one accepted token: learning that the top
    chain is always right makes verifying it worth while."""
    curve = {q: 0.040 * (1 + 0.3 * (q - 1)) for q in range(1, 66)}
    tree = _tree()
    budget = DraftBudget(curve, max_draft=16)
    for _ in range(50):
        budget.observe(tree, [3, 4, 5])
    assert budget.choose(tree) >= 3
    p = budget.probabilities(tree)
    assert np.all((p >= 0) & (p <= 1))


def _fitted(curve: dict[int, float]) -> dict[int, float]:
    """The latency a budget plans with, given a measured ``curve``."""
    return DraftBudget(curve, max_draft=8).latency


def test_latency_fit_is_monotone_and_pools_a_spike() -> None:
    smooth = {1: 0.04, 2: 0.045, 4: 0.05, 8: 0.08}
    assert _fitted(smooth) == smooth  # already monotone: unchanged
    # One slow measurement (a busy moment) is averaged with the sizes it exceeds
    # instead of raising every larger size to it.
    fitted = _fitted({1: 0.05, 2: 0.10, 3: 0.05, 4: 0.06, 5: 0.20})
    assert list(fitted.values()) == sorted(fitted.values())
    assert np.isclose(fitted[2], 0.07) and np.isclose(fitted[4], 0.07)
    assert fitted[1] == 0.05 and fitted[5] == 0.20


def test_record_latency_refines_a_size_of_the_curve_and_says_which() -> None:
    budget = DraftBudget({1: 0.04, 9: 0.08, 17: 0.12}, max_draft=16)
    assert budget.refined() == {}
    budget.record_latency(9, 0.18)
    assert np.isclose(budget.latency[9], 0.09)
    assert budget.refined() == {9: budget.latency[9]}
    # a size no step has timed keeps the curve's shape at the steps' scale
    assert np.isclose(budget.latency[17], 0.12 * 0.09 / 0.08) and budget.latency[1] == 0.04
    budget.record_latency(17, 0.12)  # once timed, a size follows its own steps
    assert np.isclose(budget.latency[17], 0.12)  # faster than the curve: taken at once
    budget.record_latency(9, 0.5)
    assert np.isclose(budget.latency[17], 0.12)
    budget.record_latency(17, 0.24)  # slower: a tenth of the way
    assert np.isclose(budget.latency[17], 0.9 * 0.12 + 0.1 * 0.24)


def test_a_step_between_sizes_moves_both_neighbours_by_its_ratio() -> None:
    """A step of 13 tokens, half-way between 9 and 17, that took twice what the curve
    says: both neighbours rise by half of the tenth a measured size would."""
    budget = DraftBudget({1: 0.04, 9: 0.08, 17: 0.12}, max_draft=16)
    budget.record_latency(13, 0.20)  # the curve says 0.10
    assert np.isclose(budget.latency[9], 0.08 * 1.05)
    assert np.isclose(budget.latency[17], 0.12 * 1.05)
    assert budget.latency[1] == 0.04
    assert set(budget.refined()) == {9, 17}
    budget.record_latency(33, 0.12)  # past the largest size: the largest alone
    assert budget.latency[17] < 0.12 * 1.05 and set(budget.refined()) == {9, 17}


def test_a_stalled_step_moves_the_curve_a_bounded_step() -> None:
    budget = DraftBudget({1: 0.04, 9: 0.08}, max_draft=16)
    budget.record_latency(1, 4.0)  # a hundred times the curve: counted as three times
    assert np.isclose(budget.latency[1], 0.04 * 1.2)
    budget.record_latency(1, 0.0)  # faster counts at once, but at most a third
    assert np.isclose(budget.latency[1], 0.04 * 1.2 / 3)


def test_no_forward_counts_dearer_than_its_tokens_one_by_one() -> None:
    budget = DraftBudget({1: 0.05, 2: 0.6, 9: 0.2}, max_draft=16)
    assert np.isclose(budget.latency[2], 0.1) and np.isclose(budget.latency[9], 0.2)
