"""Drafting: the n-gram trie, draft trees, proposers, the draft budget and the oracle.

NumPy only (no torch): a serving engine or an offline replay can draft without the
model. :class:`Drafter` is the seam the decode loop uses: ``propose`` then ``update``.
"""

from .budget import DraftBudget
from .config import DraftConfig
from .draft_tree import DraftTree
from .drafter import Drafter
from .proposers import PROPOSERS, Proposer
from .trie import NGramTrie

__all__ = ["PROPOSERS", "DraftBudget", "DraftConfig", "DraftTree", "Drafter", "NGramTrie",
           "Proposer"]
