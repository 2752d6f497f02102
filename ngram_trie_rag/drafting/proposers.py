"""Draft proposers over an :class:`NGramTrie`: the paper's tree and a prompt-lookup chain.

Both share the trie's token store and longest-prefix match; they differ only in what
they hand to the verifier. A proposer is a pure function of (trie, tail, budget), in
the spirit of vLLM's n-gram proposer, so it is trivial to test on tiny arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .draft_tree import DraftTree
from .trie import NGramTrie

Proposer = Callable[[NGramTrie, Sequence[int], int, int], DraftTree]


def propose_tree(trie: NGramTrie, tail: Sequence[int], num_draft: int,
                 max_depth: int) -> DraftTree:
    """The paper's draft: the ``num_draft`` most frequent nodes below the match."""
    return trie.draft(tail, num_draft, max_depth)


def propose_backoff(trie: NGramTrie, tail: Sequence[int], num_draft: int,
                    max_depth: int) -> DraftTree:
    """The paper's draft over the union of every back-off length's subtree."""
    return trie.draft_backoff(tail, num_draft, max_depth)


def propose_chain(trie: NGramTrie, tail: Sequence[int], num_draft: int,
                  max_depth: int) -> DraftTree:
    """Prompt-lookup style: copy what followed the most recent longest match.

    Example: context ``a b c d a b`` with tail ``a b`` drafts ``c d a b``
    (up to ``min(num_draft, max_depth)`` tokens, stopping at the document's end).
    """
    k, cont = trie.latest_continuation(tail, min(num_draft, max_depth))
    return DraftTree.chain(cont, match_len=k) if k else DraftTree.empty()


def propose_none(trie: NGramTrie, tail: Sequence[int], num_draft: int,
                 max_depth: int) -> DraftTree:
    """No speculation: every step is a plain decode step."""
    return DraftTree.empty()


PROPOSERS: dict[str, Proposer] = {
    "trie": propose_tree,
    "backoff": propose_backoff,
    "chain": propose_chain,
    "none": propose_none,
}
