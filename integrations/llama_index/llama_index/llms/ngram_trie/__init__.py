"""LlamaIndex integration of ngram-trie-rag: lossless speculative decoding drafted from the
retrieved nodes."""

from .base import NGramTrieLLM
from .drafting import DraftSource, drafting_from
from .embeddings import SentenceTransformerEmbedding
from .retrieval import NGramTrieRerank, NGramTrieRetriever, passage_to_node
from .tracking import RetrievedNodesTracker, get_tracker, registry_size

__all__ = [
    "DraftSource",
    "NGramTrieLLM",
    "NGramTrieRerank",
    "NGramTrieRetriever",
    "RetrievedNodesTracker",
    "SentenceTransformerEmbedding",
    "drafting_from",
    "get_tracker",
    "passage_to_node",
    "registry_size",
]
