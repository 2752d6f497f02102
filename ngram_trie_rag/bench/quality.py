"""Answer quality against gold answers, SQuAD style: exact match, token F1, contains.

Speed and exactness say nothing about whether the answers are any good: a speed-up
could come from degenerate text (a loop copied from the context drafts very well). So
every method's own answer is scored against the row's gold answers:

- the text is normalised: lowercased, punctuation and the articles a/an/the removed,
  whitespace collapsed (the SQuAD evaluation script's ``normalize_answer``);
- ``exact_match``: 1 when the normalised answer equals a normalised gold answer;
- ``f1``: token F1 (bag of words) with the best gold answer;
- ``contains``: 1 when a normalised gold answer is a substring of the normalised
  answer (the "accuracy" of open-domain QA with generative readers): the fair measure
  for a chat model that answers in sentences rather than in spans.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
KEYS = ("exact_match", "f1", "contains")


def normalise(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(answer: str, gold: str) -> float:
    """Harmonic mean of token precision and recall between two texts (normalised here);
    two empty texts agree (1.0), one empty text agrees with nothing (0.0)."""
    a, g = normalise(answer).split(), normalise(gold).split()
    if not a or not g:
        return float(a == g)
    common = sum((Counter(a) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(g)
    return 2 * precision * recall / (precision + recall)


def score(answer: str, golds: Sequence[str]) -> dict[str, float]:
    """One answer's ``exact_match``, ``f1`` and ``contains`` against its gold answers."""
    if not golds:
        raise ValueError("no gold answers to score against")
    norm = normalise(answer)
    gold_norms = [normalise(g) for g in golds]
    return {
        "exact_match": float(any(norm == g for g in gold_norms)),
        "f1": max(token_f1(answer, g) for g in golds),
        "contains": float(any(g and g in norm for g in gold_norms)),
    }


def mean_scores(scores: Iterable[dict[str, float] | None]) -> dict[str, float | int | None]:
    """Means over the scored answers, and how many there were (``None`` means if none)."""
    scored = [s for s in scores if s is not None]
    out: dict[str, float | int | None] = {
        k: (sum(s[k] for s in scored) / len(scored) if scored else None) for k in KEYS}
    out["scored"] = len(scored)
    return out
