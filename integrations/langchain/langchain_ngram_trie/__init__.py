"""LangChain integration for ngram-trie-rag: RAG answers sped up, losslessly, by drafting
tokens from the documents the chain retrieved.

Importing the package registers a process-wide callback handler that remembers which
documents each chain call retrieved, so ``ChatNGramTrie`` and ``NGramTrieLLM`` draft from
them with no change to the chain.
"""

from .chat_models import ChatNGramTrie
from .documents import DraftDocuments
from .generators import shared_generator
from .llms import NGramTrieLLM
from .registry import RetrievedDocumentsRegistry, document_registry
from .retrievers import NGramTrieRetriever, passage_to_document

__all__ = [
    "ChatNGramTrie",
    "DraftDocuments",
    "NGramTrieLLM",
    "NGramTrieRetriever",
    "RetrievedDocumentsRegistry",
    "document_registry",
    "passage_to_document",
    "shared_generator",
]
__version__ = "0.1.0"
