"""``load_or_build``: an on-disk cache of indexes keyed by what went into them.

An ``ask`` command over a folder should embed the folder once, not on every question. The
key hashes every document's absolute path, mtime and size (cheap: no file is read), plus
the embedder and chunking settings; touching or adding a file changes the key and rebuilds.
Older entries for the same folder are deleted after a rebuild, so the cache stays bounded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from .batches import Report
from .chunking import DEFAULT_CHUNK_SIZE, DEFAULT_OVERLAP
from .embedder import Embedder
from .errors import IndexLoadError
from .loaders import discover_files, iter_file_stats
from .reranker_base import Reranker
from .retriever import Retriever

PathLike = str | os.PathLike


def default_cache_dir() -> Path:
    """``<user cache>/ngram-trie-rag/indexes`` (``$NGRAM_TRIE_RAG_CACHE`` overrides)."""
    from ngram_trie_rag.util.cache_paths import cache_dir

    return cache_dir() / "indexes"


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def cache_key(
    docs: PathLike | Sequence[PathLike],
    embedder_name: str,
    *,
    factory: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    overlap: int = DEFAULT_OVERLAP,
) -> tuple[str, str]:
    """(key of the docs location, key of its current content + settings)."""
    roots = [docs] if isinstance(docs, (str, os.PathLike)) else list(docs)
    location = _digest(sorted(str(Path(p).resolve()) for p in roots))
    content = _digest(
        {
            "files": iter_file_stats(discover_files(docs)),
            "embedder": embedder_name,
            "factory": factory,
            "chunk_size": chunk_size,
            "overlap": overlap,
        }
    )
    return location[:12], content[:16]


def load_or_build(
    docs_path: PathLike | Sequence[PathLike],
    cache_dir: PathLike | None = None,
    *,
    embedder: Embedder | str | None = None,
    factory: str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    overlap: int = DEFAULT_OVERLAP,
    reranker: Reranker | None = None,
    top_k: int = 100,
    top_n: int = 5,
    max_passages: int | None = None,
    max_bytes: int | None = None,
    report: Report | None = None,
) -> Retriever:
    """A retriever over ``docs_path``, from the cache when its files have not changed.
    The caps and ``report`` apply when it is built (see ``Retriever.build``)."""
    if not isinstance(embedder, Embedder):
        embedder = Embedder(embedder)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    location, content = cache_key(
        docs_path, embedder.name, factory=factory, chunk_size=chunk_size, overlap=overlap
    )
    entry = root / f"{location}-{content}"
    if entry.is_dir():
        try:
            return Retriever.load(entry, embedder=embedder, reranker=reranker,
                                  top_k=top_k, top_n=top_n)
        except IndexLoadError:
            # A damaged entry is rebuilt, never fatal; the entry (named by its key, in
            # the cache's own folder) goes first, in case its manifest is damaged too.
            shutil.rmtree(entry, ignore_errors=True)
    retriever = Retriever.build(
        docs_path, embedder=embedder, factory=factory, chunk_size=chunk_size,
        overlap=overlap, reranker=reranker, top_k=top_k, top_n=top_n,
        max_passages=max_passages, max_bytes=max_bytes, report=report,
    )
    retriever.index.save(entry, extra={"docs": str(docs_path), "cache_key": content})
    for stale in root.glob(f"{location}-*"):
        if stale != entry and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return retriever
