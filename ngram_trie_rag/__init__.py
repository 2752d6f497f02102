"""ngram-trie-rag: lossless RAG speed-up with n-gram trie speculative decoding."""

from .draft_tree import DraftTree
from .generator import DraftConfig, GenerationStream, SpeculativeGenerator
from .loading import ModelNotFoundError, load_model
from .result import GenerationResult, GenerationStats
from .sampling import SamplingParams
from .trie import NGramTrie

__all__ = [
    "DraftConfig",
    "DraftTree",
    "GenerationResult",
    "GenerationStats",
    "GenerationStream",
    "ModelNotFoundError",
    "NGramTrie",
    "SamplingParams",
    "SpeculativeGenerator",
    "load_model",
]
__version__ = "0.1.0"
