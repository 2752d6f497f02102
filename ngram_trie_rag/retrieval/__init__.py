"""Retrieval for RAG: load and chunk documents, embed, index with FAISS, rerank.

Quick start::

    from ngram_trie_rag.retrieval import Retriever
    retriever = Retriever.build("examples/sample_docs")
    for passage in retriever.retrieve("How does the trie pick draft tokens?"):
        print(passage.score, passage.source)

Names are imported lazily (PEP 562), so ``import ngram_trie_rag.retrieval.cli`` for
``--help`` does not pay for torch, sentence-transformers or faiss.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Passage": "passage",
    "Document": "passage",
    "RetrievalError": "errors",
    "DocumentLoadError": "errors",
    "IndexBuildError": "errors",
    "IndexLoadError": "errors",
    "IndexSaveError": "errors",
    "ModelLoadError": "errors",
    "chunk_text": "chunking",
    "chunk_documents": "chunking",
    "load_documents": "loaders",
    "SUPPORTED_SUFFIXES": "formats",
    "Embedder": "embedder",
    "DEFAULT_EMBEDDER": "embedder",
    "choose_factory": "policy",
    "PAPER_FACTORY": "policy",
    "VectorIndex": "vector_index",
    "Reranker": "reranker_base",
    "BaseReranker": "reranker_base",
    "CrossEncoderReranker": "cross_encoder",
    "LLMReranker": "llm_reranker",
    "Retriever": "retriever",
    "load_or_build": "cache",
}

__all__ = [
    "BaseReranker",
    "CrossEncoderReranker",
    "DEFAULT_EMBEDDER",
    "Document",
    "DocumentLoadError",
    "Embedder",
    "IndexBuildError",
    "IndexLoadError",
    "IndexSaveError",
    "LLMReranker",
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
    from .llm_reranker import LLMReranker
    from .loaders import load_documents
    from .passage import Document, Passage
    from .policy import PAPER_FACTORY, choose_factory
    from .reranker_base import BaseReranker, Reranker
    from .retriever import Retriever
    from .vector_index import VectorIndex


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
