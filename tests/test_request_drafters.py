"""Per-request drafters for batching engines, on hand-computed sequences."""

from __future__ import annotations

import numpy as np
import pytest

from ngram_trie_rag.drafting import DraftConfig, DraftTree
from ngram_trie_rag.serving import RequestDrafters

CONFIG = DraftConfig(n=6, prefix_len=2, num_draft=16)


def test_best_path_follows_the_best_ranked_child() -> None:
    # cat(0) sat(1) | dog(2); dog ranked above cat: the chain is [dog]
    tree = DraftTree(np.array([7, 8, 9]), np.array([-1, 0, -1]), np.array([1, 2, 1]),
                     rank=np.array([1, 2, 0]))
    assert tree.best_path() == [9]
    assert DraftTree.chain([4, 5, 6]).best_path() == [4, 5, 6]
    assert DraftTree.empty().best_path() == []


def test_sibling_shares_are_each_continuations_part() -> None:
    # after the match: cat x3 (then sat x3), dog x1
    tree = DraftTree(np.array([7, 8, 9]), np.array([-1, 0, -1]), np.array([1, 2, 1]),
                     frequencies=np.array([3, 3, 1]))
    assert tree.sibling_shares().tolist() == pytest.approx([0.75, 1.0, 0.25])


def test_draft_tokens_come_with_how_sure_the_trie_was() -> None:
    pool = RequestDrafters(CONFIG)
    # "1 2" was followed by 3 twice and by 5 once; 3 is then always followed by 4
    path, classes = pool.propose_classed("r", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 1, 2], 13,
                                         None, k=2)
    assert path == [3, 4]
    assert classes == [1, 7]  # first token, share 2/3; deeper, the only one, seen twice


def test_prompt_drafting_and_learning() -> None:
    pool = RequestDrafters(CONFIG)
    assert pool.propose("r1", [1, 2, 3, 4, 1, 2], 6, None, k=3) == [3, 4, 1]
    # the engine accepted 3 4 and sampled 9: the drafter learns it before proposing
    assert pool.propose("r1", [1, 2, 3, 4, 1, 2, 3, 4, 9], 6, None, k=3) == []
    assert pool.propose("r1", [1, 2, 3, 4, 1, 2, 3, 4, 9, 3, 4], 6, None, k=3) == [9, 3, 4]


def test_each_request_drafts_from_its_own_documents() -> None:
    pool = RequestDrafters(CONFIG)
    prompt = [50, 51]
    assert pool.propose("a", prompt, 2, [[51, 10, 11, 12]], k=4) == [10, 11, 12]
    assert pool.propose("b", prompt, 2, [[51, 20, 21, 22]], k=4) == [20, 21, 22]
    # later steps never re-read documents: "a" still drafts from its own
    assert pool.propose("a", [*prompt, 10, 11], 2, [[11, 99]], k=2) == [12]


def test_a_request_seen_mid_answer_catches_up() -> None:
    pool = RequestDrafters(CONFIG)  # e.g. resumed after preemption
    assert pool.propose("r", [5, 6, 7, 8, 5, 6], 2, None, k=2) == [7, 8]


def test_retain_frees_finished_and_aborted_requests() -> None:
    pool = RequestDrafters(CONFIG, max_requests=2)
    pool.propose("a", [1, 2], 2, None, k=2)
    pool.propose("b", [1, 2], 2, None, k=2)
    with pytest.raises(RuntimeError, match="live requests"):
        pool.propose("c", [1, 2], 2, None, k=2)
    pool.retain(["b"])  # "a" finished or was aborted
    assert "a" not in pool and "b" in pool and len(pool) == 1
    pool.propose("c", [1, 2], 2, None, k=2)
    assert len(pool) == 2


def test_no_room_no_draft() -> None:
    assert RequestDrafters(CONFIG).propose("r", [1, 2, 1], 3, None, k=0) == []
