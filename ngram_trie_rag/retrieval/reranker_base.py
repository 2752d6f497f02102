"""The reranker seam: ``score(query, texts)`` is all a reranker implements.

``rerank`` is shared: score every candidate, sort best first (stable, so ties keep the
first-stage order), keep ``top_n`` and record the first-stage score in
``metadata["retrieval_score"]``, since both numbers are useful when debugging a miss.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from .passage import Passage


@runtime_checkable
class Reranker(Protocol):
    """Anything with this method can be given to ``Retriever(reranker=...)``."""

    def rerank(self, query: str, passages: Sequence[Passage], top_n: int = 5) -> list[Passage]:
        ...


class BaseReranker(ABC):
    """Implements ``rerank`` on top of a relevance ``score``; higher scores rank first."""

    @abstractmethod
    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """One relevance score per text, shape (len(texts),)."""

    def rerank(self, query: str, passages: Sequence[Passage], top_n: int = 5) -> list[Passage]:
        passages = list(passages)
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got {top_n}")
        if not passages:
            return []
        scores = np.asarray(self.score(query, [p.text for p in passages]), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")[:top_n]
        return [
            passages[i].with_score(scores[i], retrieval_score=passages[i].score)
            for i in order.tolist()
        ]
