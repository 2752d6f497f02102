"""LlamaIndex faces for ``ngram_trie_rag.retrieval``: its retriever as a ``BaseRetriever``,
its rerankers as a node postprocessor.

With these, a saved FAISS index and a cross-encoder or LLM reranker drop into any LlamaIndex
engine, e.g. ``RetrieverQueryEngine.from_args(NGramTrieRetriever(r), llm=NGramTrieLLM(),
node_postprocessors=[NGramTrieRerank(reranker, top_n=3)])``, and the trie is built from the
reranked nodes like with any other retriever.

Conversions keep a passage's ``id`` as the node id and put ``source`` in the metadata (the
one key the LLM sees, like ``file_name`` in LlamaIndex's own readers); the passage's other
metadata travels along hidden from the prompt and the embedder.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode
from ngram_trie_rag.wrappers.answer_scopes import object_scope

SOURCE_KEY = "source"


class PassageRetriever(Protocol):
    """What ``NGramTrieRetriever`` needs: ``ngram_trie_rag.retrieval.Retriever`` has it."""

    def retrieve(self, query: str, **kwargs: Any) -> list[Any]: ...


class PassageReranker(Protocol):
    """What ``NGramTrieRerank`` needs: every ``ngram_trie_rag.retrieval`` reranker has it."""

    def rerank(self, query: str, passages: list[Any], top_n: int = 5) -> list[Any]: ...


def passage_to_node(passage: Any) -> NodeWithScore:
    """A ``Passage`` as a scored ``TextNode`` (same id, text and score)."""
    metadata = {**dict(passage.metadata or {}), SOURCE_KEY: passage.source}
    hidden = [k for k in metadata if k != SOURCE_KEY]
    node = TextNode(
        id_=str(passage.id), text=passage.text, metadata=metadata,
        excluded_llm_metadata_keys=hidden, excluded_embed_metadata_keys=hidden,
    )
    return NodeWithScore(node=node, score=passage.score)


def _passage_class() -> type:
    from ngram_trie_rag.retrieval import Passage

    return Passage


class NGramTrieRetriever(BaseRetriever):
    """``ngram_trie_rag.retrieval.Retriever`` (FAISS search, optional reranking) as a
    LlamaIndex retriever. ``retrieve_kwargs`` are passed to every ``retrieve`` call."""

    def __init__(self, retriever: PassageRetriever, *,
                 callback_manager: CallbackManager | None = None,
                 verbose: bool = False, **retrieve_kwargs: Any) -> None:
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self._retriever = retriever
        self._retrieve_kwargs = retrieve_kwargs

    @property
    def answer_scope(self) -> str:
        """The answer scope of its nodes: the wrapped retriever's index (two wrappers of
        one index, say with and without a reranker, answer from the same documents)."""
        index = getattr(self._retriever, "index", self._retriever)
        return f"index:{object_scope(index)}"

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        passages = self._retriever.retrieve(query_bundle.query_str, **self._retrieve_kwargs)
        return [passage_to_node(p) for p in passages]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        # Embedding and search are blocking: keep them off the event loop.
        return await asyncio.to_thread(self._retrieve, query_bundle)


class NGramTrieRerank(BaseNodePostprocessor):
    """A ``ngram_trie_rag.retrieval`` reranker (cross-encoder or LLM yes/no scorer) as a node
    postprocessor: keeps the ``top_n`` best nodes, best first, scored by the reranker.

    The nodes themselves are reused unchanged (no metadata is written into them: they may be
    shared with a docstore); only the scores are the reranker's.
    """

    top_n: int = Field(default=5, ge=1, description="How many nodes to keep.")
    _reranker: PassageReranker = PrivateAttr()

    def __init__(self, reranker: PassageReranker, top_n: int = 5, **kwargs: Any) -> None:
        super().__init__(top_n=top_n, **kwargs)
        self._reranker = reranker

    @classmethod
    def class_name(cls) -> str:
        return "NGramTrieRerank"

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("reranking needs the query: pass query_bundle or query_str")
        if not nodes:
            return []
        passage_cls = _passage_class()
        # Positions as ids: node ids need not be unique across retrievers.
        passages = [
            passage_cls(
                id=str(i), text=n.node.get_content(metadata_mode=MetadataMode.EMBED),
                source=str(n.node.metadata.get(SOURCE_KEY, n.node.node_id)), score=n.score,
            )
            for i, n in enumerate(nodes)
        ]
        ranked = self._reranker.rerank(query_bundle.query_str, passages, top_n=self.top_n)
        return [NodeWithScore(node=nodes[int(p.id)].node, score=p.score) for p in ranked]

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None
                                  ) -> list[NodeWithScore]:
        # Rerankers run a model: keep it off the event loop.
        return await asyncio.to_thread(self._postprocess_nodes, nodes, query_bundle)
