"""``LexicalReranker``: BM25 over the retrieved candidates, no model at all.

Embeddings blur exact terms: a question about "error E2" can rank a passage about
"error E4" above the one that names E2. Counting the query's words in each candidate
catches that in microseconds, where a cross-encoder costs a model and an LLM reranker
one forward per passage. The term statistics (document frequency, mean length) come
from the candidates themselves, so nothing is precomputed over the index.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .reranker_base import BaseReranker

_WORD = re.compile(r"\w+", re.UNICODE)
# Words that occur in nearly every question and passage: counting them would reward
# length, not relevance.
STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in is it its of on or "
    "that the their this to was were what when where which who why will with you your".split()
)


def terms(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` without stopwords."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class LexicalReranker(BaseReranker):
    """Okapi BM25 of the query's terms in each candidate (``k1``, ``b`` as usual)."""

    name = "lexical"

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1 = k1
        self.b = b

    def __repr__(self) -> str:
        return f"LexicalReranker(k1={self.k1}, b={self.b})"

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        docs = [Counter(terms(t)) for t in texts]
        if not docs:
            return np.zeros(0, dtype=np.float32)
        lengths = [sum(d.values()) for d in docs]
        mean_length = max(sum(lengths) / len(docs), 1e-9)
        query_terms = set(terms(query))
        idf = {t: self._idf(t, docs) for t in query_terms}
        scores = [self._bm25(doc, length / mean_length, idf) for doc, length in
                  zip(docs, lengths, strict=True)]
        return np.asarray(scores, dtype=np.float32)

    @staticmethod
    def _idf(term: str, docs: Sequence[Counter]) -> float:
        """BM25's smoothed idf, always positive: a term in every candidate still counts
        a little rather than pulling a score down."""
        df = sum(1 for d in docs if term in d)
        return math.log(1.0 + (len(docs) - df + 0.5) / (df + 0.5))

    def _bm25(self, doc: Counter, relative_length: float, idf: dict[str, float]) -> float:
        norm = self.k1 * (1.0 - self.b + self.b * relative_length)
        return sum(w * doc[t] * (self.k1 + 1.0) / (doc[t] + norm)
                   for t, w in idf.items() if doc[t])
