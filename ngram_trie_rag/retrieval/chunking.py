"""Split text into overlapping word windows (the paper's corpus uses ~100-word passages).

Chunks are cut on whitespace-separated words but keep the original characters between the
first and last word, so line breaks and punctuation survive into the prompt. Overlap keeps a
sentence that straddles a boundary whole in at least one chunk.

Example: 250 words, ``chunk_size=100, overlap=20`` -> words [0,100), [80,180), [160,250).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .passage import Passage, SourceDocument

DEFAULT_CHUNK_SIZE = 100
DEFAULT_OVERLAP = 20

_WORD = re.compile(r"\S+")


def chunk_text(
    text: str,
    source: str,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    overlap: int = DEFAULT_OVERLAP,
    *,
    doc_id: str | None = None,
    metadata: dict | None = None,
) -> list[Passage]:
    """Cut ``text`` into passages of at most ``chunk_size`` words, ``overlap`` words shared.

    Passage ids are ``f"{doc_id or source}#{k}"``. Empty or blank text gives no passages
    (``load_documents`` reports empty files; this function stays total for callers).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not 0 <= overlap < chunk_size:
        raise ValueError(f"overlap must be in [0, chunk_size), got {overlap} for {chunk_size}")
    spans = [m.span() for m in _WORD.finditer(text)]
    stem = doc_id if doc_id is not None else source
    step = chunk_size - overlap
    passages: list[Passage] = []
    start = 0
    while start < len(spans):
        end = min(start + chunk_size, len(spans))
        char_start, char_end = spans[start][0], spans[end - 1][1]
        k = len(passages)
        passages.append(
            Passage(
                id=f"{stem}#{k}",
                text=text[char_start:char_end],
                source=source,
                metadata={
                    **(metadata or {}),
                    "chunk": k,
                    "char_start": char_start,
                    "char_end": char_end,
                },
            )
        )
        if end == len(spans):
            break
        start += step
    return passages


def chunk_documents(
    documents: Iterable[SourceDocument],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    overlap: int = DEFAULT_OVERLAP,
) -> list[Passage]:
    """Chunk every document, carrying its metadata into each passage."""
    passages: list[Passage] = []
    for doc in documents:
        passages.extend(
            chunk_text(
                doc.text,
                doc.source,
                chunk_size,
                overlap,
                doc_id=doc.doc_id,
                metadata=doc.metadata,
            )
        )
    return passages
