"""Retrieval for RAG: load and chunk documents, embed, index with FAISS, rerank.

Quick start::

    from ngram_trie_rag.retrieval import Retriever
    retriever = Retriever.build("examples/sample_docs")
    for passage in retriever.retrieve("How does the trie pick draft tokens?"):
        print(passage.score, passage.source)

Names are imported on first use (PEP 562), so importing the package (the command line's
``--help`` does) pays for neither torch, sentence-transformers nor faiss, and has no side
effects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..util.lazy import lazy_exports

_EXPORTS = {
    "Passage": ".passage",
    "Document": ".passage",  # deprecated: SourceDocument
    "SourceDocument": ".passage",
    "RetrievalError": ".errors",
    "DocumentLoadError": ".errors",
    "IndexBuildError": ".errors",
    "IndexLoadError": ".errors",
    "IndexSaveError": ".errors",
    "ModelLoadError": ".errors",
    "chunk_text": ".chunking",
    "chunk_documents": ".chunking",
    "load_documents": ".loaders",
    "SUPPORTED_SUFFIXES": ".formats",
    "Embedder": ".embedder",
    "DEFAULT_EMBEDDER": ".embedder",
    "choose_factory": ".policy",
    "PAPER_FACTORY": ".policy",
    "VectorIndex": ".vector_index",
    "Reranker": ".reranker_base",
    "BaseReranker": ".reranker_base",
    "CrossEncoderReranker": ".cross_encoder",
    "LLMReranker": ".llm_reranker",
    "LexicalReranker": ".lexical_reranker",
    "Retriever": ".retriever",
    "load_or_build": ".cache",
}

__all__ = [
    "BaseReranker",
    "CrossEncoderReranker",
    "DEFAULT_EMBEDDER",
    "SourceDocument",
    "DocumentLoadError",
    "Embedder",
    "IndexBuildError",
    "IndexLoadError",
    "IndexSaveError",
    "LLMReranker",
    "LexicalReranker",
    "ModelLoadError",
    "PAPER_FACTORY",
    "Passage",
    "Reranker",
    "RetrievalError",
    "Retriever",
    "SUPPORTED_SUFFIXES",
    "VectorIndex",
    "choose_factory",
    "chunk_documents",
    "chunk_text",
    "load_documents",
    "load_or_build",
]

if TYPE_CHECKING:
    from .cache import load_or_build
    from .chunking import chunk_documents, chunk_text
    from .cross_encoder import CrossEncoderReranker
    from .embedder import DEFAULT_EMBEDDER, Embedder
    from .errors import (
        DocumentLoadError,
        IndexBuildError,
        IndexLoadError,
        IndexSaveError,
        ModelLoadError,
        RetrievalError,
    )
    from .formats import SUPPORTED_SUFFIXES
    from .lexical_reranker import LexicalReranker
    from .llm_reranker import LLMReranker
    from .loaders import load_documents
    from .passage import Passage, SourceDocument
    from .policy import PAPER_FACTORY, choose_factory
    from .reranker_base import BaseReranker, Reranker
    from .retriever import Retriever
    from .vector_index import VectorIndex

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
