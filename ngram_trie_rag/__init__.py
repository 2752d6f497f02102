"""ngram-trie-rag: lossless RAG speed-up with n-gram trie speculative decoding.

Names are imported on first use (PEP 562), so ``import ngram_trie_rag.drafting`` does
not pull in torch, and importing the package has no side effects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .util.lazy import lazy_exports

_EXPORTS = {
    "AnswerStore": ".drafting",
    "DraftConfig": ".drafting",
    "DraftTree": ".drafting",
    "Drafter": ".drafting",
    "NGramTrie": ".drafting",
    "Answer": ".backends",
    "Backend": ".backends",
    "GenerationOptions": ".decoding.options",
    "Request": ".backends",
    "open_backend": ".backends",
    "GenerationResult": ".decoding.result",
    "GenerationStats": ".decoding.result",
    "GenerationStream": ".decoding.stream",
    "ModelNotFoundError": ".loading",
    "load_model": ".loading",
    "quantize_model": ".engine.quant.apply",
    "SamplingParams": ".decoding.sampling",
    "SpeculativeGenerator": ".generator",
    "shared_generator": ".wrappers.shared",
}

if TYPE_CHECKING:
    from .backends import Answer, Backend, Request, open_backend
    from .decoding.options import GenerationOptions
    from .decoding.result import GenerationResult, GenerationStats
    from .decoding.sampling import SamplingParams
    from .decoding.stream import GenerationStream
    from .drafting import AnswerStore, DraftConfig, Drafter, DraftTree, NGramTrie
    from .engine.quant.apply import quantize_model
    from .generator import SpeculativeGenerator
    from .loading import ModelNotFoundError, load_model
    from .wrappers.shared import shared_generator

__all__ = [
    "Answer",
    "AnswerStore",
    "Backend",
    "DraftConfig",
    "DraftTree",
    "Drafter",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStats",
    "GenerationStream",
    "ModelNotFoundError",
    "NGramTrie",
    "Request",
    "SamplingParams",
    "SpeculativeGenerator",
    "load_model",
    "open_backend",
    "quantize_model",
    "shared_generator",
]
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
