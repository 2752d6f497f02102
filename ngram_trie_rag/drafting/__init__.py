"""Drafting: the n-gram trie, draft trees, proposers, the draft budget, the oracle and
the store of earlier answers.

NumPy only (no torch): a serving engine or an offline replay can draft without the
model. :class:`Drafter` is the seam the decode loop uses: ``propose`` then ``update``.
"""

from .answer_store import AnswerStore
from .budget import DraftBudget
from .config import DraftConfig
from .draft_tree import DraftTree
from .drafter import Drafter
from .proposers import PROPOSERS, Proposer
from .trie import NGramTrie

__all__ = ["PROPOSERS", "AnswerStore", "DraftBudget", "DraftConfig", "DraftTree", "Drafter",
           "NGramTrie", "Proposer"]
