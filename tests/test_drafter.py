"""The Drafter seam on tiny hand-computed sequences, and drafting without torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from ngram_trie_rag.drafting import DraftBudget, DraftConfig, Drafter, NGramTrie


def test_drafting_imports_without_torch() -> None:
    code = "import sys, ngram_trie_rag.drafting; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_package_import_has_no_side_effects() -> None:
    code = ("import os, sys; os.environ.pop('HF_HUB_OFFLINE', None); "
            "import ngram_trie_rag; "
            "assert 'torch' not in sys.modules and 'HF_HUB_OFFLINE' not in os.environ")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_propose_then_update_follows_the_document() -> None:
    # document 1..7; prompt ends "9 2 3": the match "2 3" drafts "4 5 6 ..."
    config = DraftConfig(n=6, prefix_len=3, num_draft=4, adaptive=False)
    drafter = Drafter.for_request(config, [9, 2, 3], [[1, 2, 3, 4, 5, 6, 7]])
    assert drafter.source == "documents" and drafter.num_documents == 1
    assert drafter.propose(room=10).paths() == [(4,), (4, 5), (4, 5, 6), (4, 5, 6, 7)]
    drafter.update([4, 5, 8])  # accepted 4 5, bonus 8: the tail is now "4 5 8"
    assert len(drafter.propose(room=10)) == 0  # "5 8", "8": no occurrence with a follower
    drafter.update([2])
    assert drafter.propose(room=2).paths() == [(3,), (3, 4)]  # depth capped by room


def test_the_answer_is_learned() -> None:
    config = DraftConfig(n=4, prefix_len=2, num_draft=8, adaptive=False)
    drafter = Drafter.for_request(config, [1, 2], None)  # drafts from the prompt
    assert drafter.source == "prompt" and len(drafter.propose(room=8)) == 0
    drafter.update([3, 4, 5])
    drafter.update([2, 3])  # "2 3" was generated before: its continuation is drafted
    assert drafter.propose(room=8).paths()[0] == (4,)
    assert drafter.trie.num_tokens == 7


def test_budget_learns_from_each_step() -> None:
    budget = DraftBudget(dict.fromkeys(range(1, 6), 1.0), max_draft=4)
    drafter = Drafter(_trie([1, 2, 3, 4, 5]), [1], method="trie", num_draft=4, budget=budget)
    before = budget.seen.sum()
    tree = drafter.propose(room=4)
    assert len(tree) >= 1  # flat costs: every candidate is worth verifying
    drafter.update([2, 3, 9], step_seconds=3.0)
    assert budget.seen.sum() > before  # every candidate was labelled
    assert budget.latency[1 + len(tree)] > 1.0  # the step's cost refined the curve


def test_chain_copies_the_latest_occurrence() -> None:
    trie = _trie([5, 1, 2, 5, 3, 4])
    k, cont = trie.latest_continuation([9, 5], 3)
    assert k == 1 and cont.tolist() == [3, 4]  # the newest "5", cut at the document's end
    drafter = Drafter(trie, [9, 5], method="chain", num_draft=3)
    assert drafter.propose(room=3).paths() == [(3,), (3, 4)]
    assert trie.latest_continuation([7], 3)[1].size == 0


def _trie(tokens: list[int]) -> NGramTrie:
    trie = NGramTrie(n=6, prefix_len=2)
    trie.add_document(np.array(tokens))
    return trie
