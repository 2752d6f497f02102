"""The two records retrieval passes around: a loaded ``SourceDocument`` and a ``Passage``
chunk.

Both are plain dataclasses that round-trip through JSON (the on-disk chunk store is JSONL),
so no pickle is ever needed to persist an index.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SourceDocument:
    """A whole text read from one file (or one record of a JSON/JSONL file).

    ``id`` is the stem that chunk ids are built from; it defaults to ``source``.
    """

    text: str
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    @property
    def doc_id(self) -> str:
        return self.id if self.id is not None else self.source


@dataclass
class Passage:
    """A chunk of a document: the unit that is embedded, searched, reranked and shown.

    ``score`` is ``None`` until a search (inner product of normalised vectors, i.e. cosine)
    or a reranker sets it; the higher the better in both cases.
    """

    id: str
    text: str
    source: str
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def with_score(self, score: float, **metadata: Any) -> Passage:
        """A copy with ``score`` set, so stored passages are never mutated by a search.
        (Direct construction: ``dataclasses.replace`` was most of the search time for
        k=100 on a 170k-vector IVF-PQ index.)"""
        return Passage(self.id, self.text, self.source, float(score), {**self.metadata, **metadata})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Passage:
        """Inverse of :meth:`to_dict`. A bad record raises ``KeyError`` (missing field),
        ``TypeError`` (wrong type) or ``ValueError`` (a score that is not a number); the
        store turns each into an ``IndexLoadError``."""
        if not isinstance(data, dict):
            raise TypeError(f"a passage record must be an object, not {type(data).__name__}")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TypeError(f"passage metadata must be an object, not {metadata!r}")
        return cls(
            id=str(data["id"]),
            text=str(data["text"]),
            source=str(data["source"]),
            score=None if data.get("score") is None else float(data["score"]),
            metadata=dict(metadata),
        )


def __getattr__(name: str) -> Any:
    # ``Document`` was this record's first name; it also names the frameworks' documents
    # and the core's draft inputs, so it is kept only as a deprecated alias.
    if name == "Document":
        warnings.warn("ngram_trie_rag.retrieval.Document is deprecated; use SourceDocument",
                      DeprecationWarning, stacklevel=2)
        return SourceDocument
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
