"""NGramTrie against hand-computed examples and a literal Algorithm 1 oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_trie import all_paths, build

from ngram_trie_rag import NGramTrie
from ngram_trie_rag.drafting.proposers import propose_chain

# The paper's Figure 1 setting: n = 6, L_p = 3, over the document a b c d e f g.
#   windows: [1..6] [2..7] [3..7] [4..7] [5..7] [6,7] [7] (the last ones truncated)
#   keys of window 0: 1 2 3 4 5 6 | 2 3 4 5 6 | 3 4 5 6, and so on.
DOC = [1, 2, 3, 4, 5, 6, 7]


@pytest.fixture
def fig1() -> NGramTrie:
    trie = NGramTrie(n=6, prefix_len=3)
    trie.add_document(DOC)
    return trie


def test_figure1_node_frequencies(fig1: NGramTrie) -> None:
    assert fig1.frequency([1]) == 1  # only window 0, j = 0
    assert fig1.frequency([2]) == 2  # windows 0 (j=1) and 1 (j=0)
    assert fig1.frequency([3]) == 3  # windows 0, 1, 2
    assert fig1.frequency([3, 4, 5, 6]) == 3
    assert fig1.frequency([3, 4, 5, 6, 7]) == 2  # window 0's key stops at 6
    assert fig1.frequency([2, 3, 4, 5, 6, 7]) == 1
    assert fig1.frequency([1, 2, 3, 4, 5, 6]) == 1
    assert fig1.frequency([1, 2, 3, 4, 5, 6, 7]) == 0  # longer than n
    assert fig1.frequency([7]) == 3  # windows 4, 5, 6 (truncated tails)
    assert fig1.frequency([4, 3]) == 0
    assert fig1.children([3]) == {4: 3}


def test_figure1_matches_literal_algorithm(fig1: NGramTrie) -> None:
    ref = all_paths(build([DOC], 6, 3))
    assert fig1.num_nodes == len(ref)
    assert {p: fig1.frequency(list(p)) for p in ref} == ref


def test_draft_longest_prefix_and_pruning(fig1: NGramTrie) -> None:
    tree = fig1.draft([9, 2, 3], num_draft=3)  # matches "2 3" (k = 2)
    assert tree.match_len == 2
    assert tree.paths() == [(4,), (4, 5), (4, 5, 6)]  # (4,5,6,7) has frequency 1 < 2
    assert tree.frequencies.tolist() == [2, 2, 2]
    assert tree.parents.tolist() == [-1, 0, 1]
    assert tree.depths.tolist() == [1, 2, 3]


def test_draft_backs_off_to_shorter_prefix(fig1: NGramTrie) -> None:
    tree = fig1.draft([5, 9, 3], num_draft=10)  # "5 9 3", "9 3" absent; "3" present
    assert tree.match_len == 1
    assert dict(zip(tree.paths(), tree.frequencies.tolist(), strict=True)) == {
        (4,): 3, (4, 5): 3, (4, 5, 6): 3, (4, 5, 6, 7): 2}


def test_no_match_gives_empty_draft(fig1: NGramTrie) -> None:
    assert len(fig1.draft([8, 9], num_draft=8)) == 0
    assert len(fig1.draft([], num_draft=8)) == 0


def test_path_without_continuation_backs_off() -> None:
    trie = NGramTrie(n=4, prefix_len=2)
    trie.add_document([1, 2, 3])
    trie.add_document([3, 4])
    # "2 3" exists but ends its document; the draft backs off to "3" -> 4.
    assert trie.draft([2, 3], num_draft=4).paths() == [(4,)]


def test_no_ngram_crosses_documents() -> None:
    trie = NGramTrie(n=4, prefix_len=2)
    trie.add_document([1, 2])
    trie.add_document([3, 4])
    assert trie.frequency([2, 3]) == 0
    assert len(trie.draft([1, 2], num_draft=4)) == 0


def test_pruning_keeps_ancestors_and_breaks_ties_deterministically() -> None:
    trie = NGramTrie(n=4, prefix_len=1)
    # After token 1: "2 5" three times, "3 6" twice, "4" once.
    for doc in [[1, 2, 5]] * 3 + [[1, 3, 6]] * 2 + [[1, 4]]:
        trie.add_document(doc)
    tree = trie.draft([1], num_draft=3)
    assert tree.paths() == [(2,), (2, 5), (3,)]  # 3, 3, then 2 beats (3, 6)'s 2 by depth
    for i, parent in enumerate(tree.parents.tolist()):
        assert parent < i
        if parent >= 0:
            assert tree.frequencies[parent] >= tree.frequencies[i]
    again = trie.draft([1], num_draft=3)
    assert again.paths() == tree.paths()


def test_extend_learns_generated_tokens() -> None:
    trie = NGramTrie(n=5, prefix_len=2)
    trie.add_document([10, 11, 12])
    trie.add_document([])  # the answer's document
    assert len(trie.draft([20, 21], num_draft=4)) == 0
    trie.extend([20, 21, 22, 23])
    assert trie.draft([20, 21], num_draft=4).paths() == [(22,), (22, 23)]
    assert trie.frequency([21, 22]) == 2  # windows starting at 20 and 21


def test_chain_proposer_copies_most_recent_continuation() -> None:
    trie = NGramTrie(n=6, prefix_len=2)
    trie.add_document([1, 2, 3, 4, 1, 2, 5, 6])
    tree = propose_chain(trie, [1, 2], num_draft=3, max_depth=10)
    assert tree.tokens.tolist() == [5, 6]  # most recent "1 2", stops at document end
    assert tree.parents.tolist() == [-1, 0]


def test_max_depth_limits_draft(fig1: NGramTrie) -> None:
    tree = fig1.draft([3], num_draft=10, max_depth=2)
    assert tree.paths() == [(4,), (4, 5)]


def test_memory_bound_evicts_oldest_tokens() -> None:
    trie = NGramTrie(n=4, prefix_len=2, max_tokens=64)
    for i in range(100):
        trie.extend([i % 50 + 1])
    assert trie.num_tokens <= 64
    assert trie.evicted_tokens == 100 - trie.num_tokens
    assert trie.frequency([1, 2]) == 0 or trie.num_tokens >= 50  # oldest gone first
    assert trie.draft([48, 49], num_draft=4).paths()[0] == (50,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n": 3, "prefix_len": 3}, "n must be greater"), ({"prefix_len": 0}, "prefix_len"),
     ({"max_tokens": 0}, "max_tokens")],
)
def test_invalid_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NGramTrie(**kwargs)


def test_invalid_tokens_and_budget(fig1: NGramTrie) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        fig1.add_document([1, -5])
    with pytest.raises(ValueError, match="num_draft"):
        fig1.draft([3], num_draft=0)


docs_strategy = st.lists(st.lists(st.integers(0, 5), max_size=14), min_size=1, max_size=3)


def _literal_case(docs: list[list[int]], n: int, data) -> tuple:
    """(L_p, tail, literal {path: frequency}, NGramTrie) for one drawn example."""
    lp = data.draw(st.integers(1, n - 1))
    tail = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    trie = NGramTrie(n, lp)
    for d in docs:
        trie.add_document(d)
    return lp, tail, all_paths(build(docs, n, lp)), trie


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, n=st.integers(2, 8), data=st.data())
def test_property_equals_literal_algorithm(docs: list[list[int]], n: int, data) -> None:
    lp, tail, ref, trie = _literal_case(docs, n, data)
    assert trie.num_nodes == len(ref)
    for path, freq in ref.items():
        assert trie.frequency(list(path)) == freq
    k, _ = trie.match(tail)
    tree = trie.draft(tail, num_draft=10**6)
    if k:
        key = tuple(tail[-k:])
        below = {p[k:]: f for p, f in ref.items() if p[:k] == key and len(p) > k}
        assert dict(zip(tree.paths(), tree.frequencies.tolist(), strict=True)) == below
    budget = data.draw(st.integers(1, 6))
    pruned = trie.draft(tail, num_draft=budget)
    assert len(pruned) <= budget
    kept = set(pruned.paths())
    assert all(p[:-1] in kept for p in kept if len(p) > 1)  # ancestor-closed


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_fuzz_large_vocabulary(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([256, 32_000, 128_256, 262_144]))
    trie = NGramTrie(n=int(rng.integers(4, 16)), prefix_len=3, max_tokens=2_000)
    for _ in range(int(rng.integers(1, 6))):
        trie.add_document(rng.integers(0, vocab, int(rng.integers(0, 800))))
        trie.extend(rng.integers(0, min(vocab, 50), int(rng.integers(0, 200))))
        assert trie.num_tokens <= 2_000
        tail = rng.integers(0, min(vocab, 50), 3)
        tree = trie.draft(tail, num_draft=int(rng.integers(1, 64)))
        assert (tree.parents < np.arange(len(tree))).all()
        assert (tree.tokens >= 0).all()


def test_backoff_draft_adds_shorter_matches(fig1: NGramTrie) -> None:
    fig1.add_document([9, 3, 8])  # "3" is also followed by 8, after a different prefix
    paper = fig1.draft([1, 2, 3], num_draft=100)
    union = fig1.draft_backoff([1, 2, 3], num_draft=100)
    assert set(paper.paths()) == {(4,), (4, 5), (4, 5, 6)}  # the 3-token match only
    assert set(union.paths()) == set(paper.paths()) | {(8,), (4, 5, 6, 7)}
    match = dict(zip(union.paths(), union.node_matches().tolist(), strict=True))
    assert match[(4,)] == 3 and match[(8,)] == 1
    assert match[(4, 5, 6, 7)] == 2  # "2 3" + 4 more tokens still fits n = 6
    # The longest match's nodes rank first: a small budget drafts what the paper's does.
    assert set(fig1.draft_backoff([1, 2, 3], num_draft=3).paths()) == set(paper.paths())


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, n=st.integers(2, 8), data=st.data())
def test_backoff_draft_equals_union_of_literal_subtrees(docs: list[list[int]], n: int,
                                                        data) -> None:
    lp, tail, ref, trie = _literal_case(docs, n, data)
    # Literal: below each back-off length k, the subtree of tail[-k:]; a node keeps the
    # longest k it appears under and its frequency there.
    union: dict[tuple[int, ...], tuple[int, int]] = {}
    for k in range(1, min(lp, len(tail)) + 1):
        key = tuple(tail[-k:])
        for p, f in ref.items():
            if p[:k] == key and len(p) > k:
                union[p[k:]] = (k, f)  # a longer k overwrites a shorter one
    tree = trie.draft_backoff(tail, num_draft=10**6)
    got = zip(tree.paths(), tree.node_matches().tolist(), tree.frequencies.tolist(),
              strict=True)
    assert {p: (m, f) for p, m, f in got} == union
    paper = trie.draft(tail, num_draft=10**6)
    if len(paper):  # the longest match's nodes rank first
        assert set(trie.draft_backoff(tail, num_draft=len(paper)).paths()) == set(paper.paths())
    budget = data.draw(st.integers(1, 6))
    kept = set(trie.draft_backoff(tail, num_draft=budget).paths())
    assert len(kept) <= budget and all(p[:-1] in kept for p in kept if len(p) > 1)
