"""ngram-trie-rag: lossless RAG speed-up with n-gram trie speculative decoding.

Names are imported on first use (PEP 562), so ``import ngram_trie_rag.drafting`` does
not pull in torch, and importing the package has no side effects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

_EXPORTS = {
    "AnswerStore": ".drafting",
    "DraftConfig": ".drafting",
    "DraftTree": ".drafting",
    "Drafter": ".drafting",
    "NGramTrie": ".drafting",
    "GenerationResult": ".result",
    "GenerationStats": ".result",
    "GenerationStream": ".stream",
    "ModelNotFoundError": ".loading",
    "load_model": ".loading",
    "SamplingParams": ".sampling",
    "SpeculativeGenerator": ".generator",
    "shared_generator": ".shared",
}

if TYPE_CHECKING:
    from .drafting import AnswerStore, DraftConfig, Drafter, DraftTree, NGramTrie
    from .generator import SpeculativeGenerator
    from .loading import ModelNotFoundError, load_model
    from .result import GenerationResult, GenerationStats
    from .sampling import SamplingParams
    from .shared import shared_generator
    from .stream import GenerationStream

__all__ = [
    "AnswerStore",
    "DraftConfig",
    "DraftTree",
    "Drafter",
    "GenerationResult",
    "GenerationStats",
    "GenerationStream",
    "ModelNotFoundError",
    "NGramTrie",
    "SamplingParams",
    "SpeculativeGenerator",
    "load_model",
    "shared_generator",
]
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
