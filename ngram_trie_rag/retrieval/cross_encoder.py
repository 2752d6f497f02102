"""``CrossEncoderReranker``: a sentence-transformers ``CrossEncoder`` reads query and passage
together, which ranks far better than comparing two independent embeddings.

The paper uses BAAI/bge-reranker-v2-m3; any CrossEncoder hub id or local folder works,
resolved as sentence-transformers does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .embedder import default_device, load_local
from .reranker_base import BaseReranker

PAPER_CROSS_ENCODER = "BAAI/bge-reranker-v2-m3"


class CrossEncoderReranker(BaseReranker):
    """Scores (query, passage) pairs with a cross-encoder; loads the model lazily."""

    def __init__(
        self,
        model: str | os.PathLike = PAPER_CROSS_ENCODER,
        *,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int | None = 512,
    ) -> None:
        path = Path(model).expanduser()
        self.name = str(path.resolve()) if path.exists() else str(model)
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self._model = None

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({self.name!r})"

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = load_local(CrossEncoder, self.name, "cross-encoder",
                                     device=self.device or default_device(),
                                     max_length=self.max_length)
        return self._model

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float32)
        scores = self.model.predict(
            [(query, text) for text in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        # Multi-label heads: the last column is the "relevant" class by convention.
        scores = np.asarray(scores, dtype=np.float32)
        return scores[:, -1] if scores.ndim == 2 else scores
