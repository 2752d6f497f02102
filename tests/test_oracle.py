"""The offline ceiling: hand-computed oracle steps, and the bound it puts on every drafter.

The depth-capped oracle claims to be the best any context-copying drafter verifying at
most K nodes per step can do. The property test checks that claim against the real
proposers replayed on random sequences: none of them ever needs fewer steps.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngram_trie_rag.drafting import DraftConfig, Drafter
from ngram_trie_rag.drafting.budget import DraftBudget
from ngram_trie_rag.drafting.oracle import (
    hindsight_accept_lengths,
    oracle_accept_length,
    oracle_accept_lengths,
    replay_accept_lengths,
    same_size_bounds,
)


def test_hand_computed_steps() -> None:
    # prompt 5 6 7 8, answer 1 5 6 7 8 9: the first token comes from prefill; "5" after
    # "1" has no source (accept 1); after "5" the prompt's "6 7 8" is copied, "9" is the
    # bonus token (accept 4).
    assert oracle_accept_lengths([5, 6, 7, 8], [1, 5, 6, 7, 8, 9]) == [1, 4]
    # two draft tokens a step: "6 7" + bonus "8", then "8" is followed by "1" in the
    # sequence, not "9": accept 1.
    assert oracle_accept_lengths([5, 6, 7, 8], [1, 5, 6, 7, 8, 9], max_draft=2) == [1, 3, 1]
    assert oracle_accept_lengths([5, 6, 7, 8], [1, 5, 6, 7, 8, 9], max_draft=0) == [1] * 5
    assert oracle_accept_length([5, 6, 7, 8], [1, 5, 6, 7, 8, 9]) == pytest.approx(2.5)


def test_copies_only_committed_tokens() -> None:
    # answer 3 3 3 3 3 3: after the second "3" the only source is the first one, and
    # what follows it is committed for one token only (the rest is still to be
    # verified): accept 2, not 4. Then two tokens a step are all that is left to verify.
    assert oracle_accept_lengths([9], [3, 3, 3, 3, 3, 3]) == [1, 2, 2]
    assert oracle_accept_length([9], [3]) == 0.0  # nothing to verify after prefill


def test_negative_cap_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_draft"):
        oracle_accept_lengths([1, 2], [3, 4], max_draft=-1)


def test_same_size_bounds_follow_the_run() -> None:
    # The run stepped 1, 1, 3 with 0, 3, 3 nodes: after "5" three nodes could have held
    # "6 7 8" (bound 4); after "6" the run copied "7 8", all there was (bound 3).
    prompt, answer = [5, 6, 7, 8], [1, 5, 6, 7, 8, 9]
    assert same_size_bounds(prompt, answer, [1, 1, 3], [0, 3, 3]) == [1, 4, 3]
    with pytest.raises(ValueError, match="one of each per step"):
        same_size_bounds(prompt, answer, [1, 1, 3], [0, 3])
    with pytest.raises(ValueError, match="add up"):
        same_size_bounds(prompt, answer, [1, 1, 2], [0, 3, 3])


def _chain(prompt: list[int]):
    """A fresh prompt-lookup drafter over ``prompt`` with no budget."""
    return lambda: Drafter.for_request(DraftConfig(method="chain"), prompt, num_draft=8)


def test_hindsight_takes_the_size_that_pays() -> None:
    # After "1" nothing matches: a plain step. After "5" the chain drafts "6 7 8 1":
    # three nodes hold the true "6 7 8", so verifying 3 accepts 4 tokens (bonus "9").
    prompt, answer = [5, 6, 7, 8], [1, 5, 6, 7, 8, 9]
    sizes: list[int] = []
    cheap = hindsight_accept_lengths(_chain(prompt), answer, lambda k: 1 + 0.1 * k,
                                     drafted=sizes)
    assert (cheap, sizes) == ([1, 4], [0, 3])
    # A node costing ten plain steps never pays: every step is plain.
    sizes = []
    dear = hindsight_accept_lengths(_chain(prompt), answer, lambda k: 1 + 10 * k,
                                    drafted=sizes)
    assert (dear, sizes) == ([1] * 5, [0] * 5)


def test_hindsight_with_flat_cost_accepts_all_the_ranking_holds() -> None:
    # When a bigger tree costs nothing more, hindsight verifies the whole true path
    # among the candidates at every step: the fixed-size replay's steps, with no
    # more nodes than that path needs.
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
    answer = [1, 4, 1, 5, 9, 2, 6, 1, 5, 9, 7, 9, 3, 2, 3]
    fixed = replay_accept_lengths(_chain(prompt)(), answer)
    sizes: list[int] = []
    assert hindsight_accept_lengths(_chain(prompt), answer, lambda k: 1.0,
                                    drafted=sizes) == fixed
    assert all(k == a - 1 for k, a in zip(sizes, fixed, strict=True))  # a chain's ranks


def test_hindsight_needs_a_drafter_without_budget() -> None:
    budget = DraftBudget({1: 1.0, 2: 1.1}, max_draft=4)
    with_budget = lambda: Drafter.for_request(DraftConfig(), [1, 2, 3], budget=budget)  # noqa: E731
    with pytest.raises(ValueError, match="no budget"):
        hindsight_accept_lengths(with_budget, [1, 2, 3], lambda k: 1.0)


seqs = st.lists(st.integers(0, 5), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(prompt=seqs, answer=st.lists(st.integers(0, 5), min_size=2, max_size=60),
       k=st.integers(1, 12), n=st.integers(2, 14), data=st.data(),
       method=st.sampled_from(["trie", "backoff", "chain"]))
def test_no_drafter_beats_the_capped_oracle(prompt, answer, k, n, data, method) -> None:
    """A drafter verifying at most K nodes from prompt + answer needs at least as many
    steps as the K-capped oracle, which needs at least as many as the uncapped one."""
    prefix_len = data.draw(st.integers(1, n - 1))
    steps = replay_accept_lengths(_drafter(prompt, n, prefix_len, method, k), answer)
    capped = oracle_accept_lengths(prompt, answer, max_draft=k)
    free = oracle_accept_lengths(prompt, answer)
    assert sum(steps) == sum(capped) == sum(free) == len(answer) - 1
    assert len(steps) >= len(capped) >= len(free)
    assert max(capped) <= k + 1
    # step by step, no step accepts more than the best copy with its own node count
    drafted: list[int] = []
    steps = replay_accept_lengths(_drafter(prompt, n, prefix_len, method, k), answer,
                                  drafted=drafted)
    bounds = same_size_bounds(prompt, answer, steps, drafted)
    assert all(a <= b for a, b in zip(steps, bounds, strict=True))


def _drafter(prompt: list[int], n: int, prefix_len: int, method: str, k: int) -> Drafter:
    """A drafter over ``prompt`` (the answer continues it) with ``k`` nodes pinned."""
    config = DraftConfig(n=n, prefix_len=prefix_len, num_draft=k, method=method)
    return Drafter.for_request(config, prompt)
