"""``NGramTrieRetriever``: ngram-trie-rag's FAISS (+ reranker) retriever in LangChain.

Passages become ``Document`` objects that keep the passage id (``Document.id``), source and
score (metadata), so a model's ``response_metadata["speculative"]["documents"]`` names the
exact passages it drafted from.

Its metadata names an answer scope, ``ngram_trie_scope = "index:VectorIndex#1"``, after the
index it searches, so answers drafted from this retriever's documents are kept for later
questions to it and for no other index's (set ``metadata={"ngram_trie_scope": ...}`` to
choose the name).
"""

from __future__ import annotations

import inspect
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY, object_scope
from pydantic import ConfigDict, Field

# Names a wrapped retriever may use for "how many passages to return".
_COUNT_ARGS = ("top_n", "top_k", "k")


def passage_to_document(passage: Any) -> Document:
    """A retrieval ``Passage`` (``id, text, source, score, metadata``) as a Document."""
    metadata = {**(passage.metadata or {}), "source": passage.source}
    if passage.score is not None:
        metadata["score"] = float(passage.score)
    return Document(page_content=passage.text, id=str(passage.id), metadata=metadata)


class NGramTrieRetriever(BaseRetriever):
    """Wraps ``ngram_trie_rag.retrieval.Retriever`` (anything with ``retrieve(query)``
    returning passages).

    Example:
        ```python
        from ngram_trie_rag.retrieval import Retriever

        retriever = NGramTrieRetriever(retriever=Retriever.load("my-index"), k=5)
        retriever.invoke("Where was Socrates born?")
        ```

    ``k`` (here or per call: ``invoke(query, k=3)``) caps the number of documents; when
    the wrapped retriever takes a count argument, it is asked for exactly that many.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    """The wrapped retriever: ``retrieve(query) -> list[Passage]``."""
    k: int | None = Field(default=None, ge=1)
    """Documents to return; ``None`` keeps the wrapped retriever's own count."""

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        # The index, not this wrapper, is the scope: two wrappers of one index (say with
        # and without a reranker) answer from the same documents.
        index = getattr(self.retriever, "index", self.retriever)
        self.metadata = {SCOPE_KEY: f"index:{object_scope(index)}", **(self.metadata or {})}

    def _count_arg(self) -> str | None:
        try:
            params = inspect.signature(self.retriever.retrieve).parameters
        except (TypeError, ValueError):
            return None
        return next((name for name in _COUNT_ARGS if name in params), None)

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None) -> list[Document]:
        limit = k if k is not None else self.k
        if limit is not None and limit < 1:
            raise ValueError(f"k must be >= 1, got {limit}")
        count_arg = self._count_arg() if limit is not None else None
        if count_arg is not None:
            passages = self.retriever.retrieve(query, **{count_arg: limit})
        else:
            passages = self.retriever.retrieve(query)
        documents = [passage_to_document(p) for p in passages]
        return documents[:limit] if limit is not None else documents

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None) -> list[Document]:
        # Searching and reranking are blocking (FAISS, a model forward): off the loop.
        return await run_in_executor(None, self._get_relevant_documents, query,
                                     run_manager=run_manager.get_sync(), k=k)
