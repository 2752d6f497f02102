"""LangChain integration for ngram-trie-rag: RAG answers sped up, losslessly, by drafting
tokens from the documents the chain retrieved.

Building a ``ChatNGramTrie`` or ``NGramTrieLLM`` registers, once per process, a callback
handler that remembers which documents each chain call retrieved, so the models draft from
them with no change to the chain. Importing the package registers nothing.
"""

from ngram_trie_rag import shared_generator

from .chat_models import ChatNGramTrie
from .documents import DraftDocuments
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
