"""``Retriever``: the RAG front half. Embed the query, take the top ``top_k`` (100) passages
from the index, then let a reranker pick the best ``top_n`` (5); without a reranker the
first ``top_n`` by cosine similarity are returned.

The paper's pipeline is bge-m3 -> FAISS IVF4096,PQ64 (nprobe 16) top-100 ->
bge-reranker-v2-m3 top-5; here each stage is swappable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .batches import Report
from .chunking import DEFAULT_CHUNK_SIZE, DEFAULT_OVERLAP, chunk_documents
from .embedder import Embedder
from .limits import check_bytes, check_passages, human_bytes
from .loaders import discover_files, load_documents
from .passage import Passage
from .reranker_base import Reranker
from .vector_index import VectorIndex

Sources = str | os.PathLike | Sequence[str | os.PathLike] | Sequence[Passage]


def _as_passages(sources: Sources, chunk_size: int, overlap: int, *,
                 max_passages: int | None = None, max_bytes: int | None = None,
                 report: Report | None = None) -> list[Passage]:
    """Passages as given, or files/folders loaded and chunked, within the caps (the byte
    cap is checked from file sizes, before anything is read)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    items = list(sources)
    if items and all(isinstance(item, Passage) for item in items):
        check_passages(len(items), max_passages)
        return items  # type: ignore[return-value]
    if any(isinstance(item, Passage) for item in items):
        raise TypeError("pass either paths or Passage objects, not a mix")
    files = discover_files(items)  # type: ignore[arg-type]
    size = check_bytes(files, max_bytes)
    passages = chunk_documents(load_documents(files), chunk_size, overlap)
    if report is not None:
        report(f"{len(files)} files, {human_bytes(size)}: {len(passages):,} passages")
    check_passages(len(passages), max_passages)
    return passages


class Retriever:
    """Query -> top passages (with scores), over a ``VectorIndex``."""

    def __init__(
        self,
        index: VectorIndex,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
        top_k: int = 100,
        top_n: int = 5,
    ) -> None:
        embedder = embedder if embedder is not None else index.embedder
        if embedder.name != index.embedder_name:
            raise ValueError(
                f"embedder {embedder.name!r} differs from the index's {index.embedder_name!r}"
            )
        if top_k < 1 or top_n < 1:
            raise ValueError(f"top_k and top_n must be >= 1, got {top_k} and {top_n}")
        self.index = index
        self.embedder = embedder
        self.reranker = reranker
        self.top_k = top_k
        self.top_n = top_n

    def __repr__(self) -> str:
        return (
            f"Retriever({self.index!r}, reranker={self.reranker!r}, top_k={self.top_k}, "
            f"top_n={self.top_n})"
        )

    def retrieve(self, query: str, *, top_n: int | None = None) -> list[Passage]:
        """Best passages for ``query``, best first, ``score`` set (reranker's if any)."""
        return self.retrieve_batch([query], top_n=top_n)[0]

    def retrieve_batch(
        self, queries: Sequence[str], *, top_n: int | None = None
    ) -> list[list[Passage]]:
        """Like ``retrieve`` for many queries; embeds and searches them in one batch."""
        top_n = top_n or self.top_n
        queries = list(queries)
        if not queries:
            return []
        vectors = self.embedder.encode_queries(queries)
        # Without a reranker only top_n are ever shown, so do not fetch more than that.
        k = self.top_k if self.reranker is not None else min(self.top_k, top_n)
        candidates = self.index.search(vectors, k=max(k, top_n))
        if self.reranker is None:
            return [found[:top_n] for found in candidates]
        return [
            self.reranker.rerank(query, found, top_n=top_n)
            for query, found in zip(queries, candidates, strict=True)
        ]

    @classmethod
    def build(
        cls,
        sources: Sources,
        *,
        embedder: Embedder | str | None = None,
        factory: str | None = None,
        nprobe: int | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        overlap: int = DEFAULT_OVERLAP,
        reranker: Reranker | None = None,
        top_k: int = 100,
        top_n: int = 5,
        progress: bool | None = None,
        max_passages: int | None = None,
        max_bytes: int | None = None,
        report: Report | None = None,
    ) -> Retriever:
        """Index files, folders or ready ``Passage`` objects in one call.

        ``max_bytes`` (total file size) and ``max_passages`` stop an oversized build before
        it embeds anything (``InputTooLargeError``); ``report`` gets a line with the
        passage count and one with the time estimate before the embedding starts.
        """
        if not isinstance(embedder, Embedder):
            embedder = Embedder(embedder)
        passages = _as_passages(sources, chunk_size, overlap, max_passages=max_passages,
                                max_bytes=max_bytes, report=report)
        index = VectorIndex(embedder, factory=factory, nprobe=nprobe)
        index.add(passages, progress=progress, report=report)
        return cls(index, embedder, reranker=reranker, top_k=top_k, top_n=top_n)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
        top_k: int = 100,
        top_n: int = 5,
    ) -> Retriever:
        """Open an index saved by ``save`` (or ``VectorIndex.save``)."""
        index = VectorIndex.load(path, embedder)
        return cls(index, index.embedder, reranker=reranker, top_k=top_k, top_n=top_n)

    def save(self, path: str | os.PathLike) -> Path:
        self.index.save(path)
        return Path(path)
