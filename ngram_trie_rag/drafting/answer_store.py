"""Earlier answers of one scope, kept to draft later answers from (SuffixDecoding-style).

In a RAG app the same documents come back for follow-up and related questions, and the
answers repeat each other: phrases of the first answer reappear in the second. A
request's trie holds only its own documents and output, so it cannot draft those
phrases until the new answer has produced them once. An :class:`AnswerStore` keeps the
token sequences of earlier answers; a request given the store drafts from them as well,
each answer inserted into its trie like one more document.

Scope: the store object *is* the scope. Nothing is shared between stores, so an app
creates one per index, session or chain, and answers never cross into another scope
(a shared pool mixes unrelated answers into every draft and costs acceptance).

Memory is bounded by tokens, not answers: past ``max_tokens`` the oldest answers go
first. Drafts only change how fast an answer comes, never what it is: greedy output
stays token-identical to plain decoding whatever the store holds.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..validation import integer

Answer = tuple[int, ...]


class AnswerStore:
    """A bounded, thread-safe, oldest-first-evicted pool of earlier answers' tokens.

    Args:
        max_tokens: the most tokens held, summed over answers. An answer longer than
            this keeps its last ``max_tokens`` tokens.
        min_tokens: answers shorter than this are skipped: an "I don't know" or an
            empty reply adds nothing worth drafting and would only take room.

    Example::

        store = AnswerStore(max_tokens=6, min_tokens=1)
        store.add([1, 2, 3, 4])
        store.add([5, 6, 7])       # 7 tokens > 6: [1, 2, 3, 4] is evicted
        store.answers()            # -> [(5, 6, 7)]

    Adding an answer the store already holds moves it to the newest place instead of
    holding it twice (the same question asked again gives the same greedy answer).
    """

    def __init__(self, max_tokens: int = 200_000, *, min_tokens: int = 4) -> None:
        self.max_tokens = integer("max_tokens", max_tokens, low=1)
        self.min_tokens = integer("min_tokens", min_tokens, low=1)
        self._lock = threading.Lock()
        self._answers: OrderedDict[Answer, None] = OrderedDict()  # oldest first
        self._tokens = 0  # invariant: == sum(len(a) for a in self._answers) <= max_tokens

    def add(self, tokens: Sequence[int] | np.ndarray) -> bool:
        """Keep one finished answer's token ids; ``True`` if it was kept."""
        answer = _as_answer(tokens)
        if len(answer) < self.min_tokens:
            return False
        answer = answer[-self.max_tokens:]
        with self._lock:
            if answer in self._answers:
                self._answers.move_to_end(answer)
                return True
            self._answers[answer] = None
            self._tokens += len(answer)
            while self._tokens > self.max_tokens:  # oldest first; the new one always fits
                oldest, _ = self._answers.popitem(last=False)
                self._tokens -= len(oldest)
        return True

    def answers(self) -> list[Answer]:
        """A snapshot, oldest first: later adds and evictions do not change it."""
        with self._lock:
            return list(self._answers)

    @property
    def tokens(self) -> int:
        """Tokens held, summed over answers."""
        return self._tokens

    def clear(self) -> None:
        """Forget every answer (e.g. when the scope's documents change)."""
        with self._lock:
            self._answers.clear()
            self._tokens = 0

    def __len__(self) -> int:
        return len(self._answers)

    def __repr__(self) -> str:
        return f"AnswerStore({len(self)} answers, {self.tokens}/{self.max_tokens} tokens)"


def check_answer_store(value: object) -> AnswerStore | None:
    """``None`` or an :class:`AnswerStore`; a ``TypeError`` for anything else. A plain
    list of answers is refused on purpose: the store object is the scope, and a list
    would neither be bounded nor learn from the answer being made."""
    if value is None or isinstance(value, AnswerStore):
        return value
    raise TypeError(f"answer_store must be an AnswerStore or None, got {type(value).__name__}"
                    " (create one per index, session or chain: AnswerStore())")


def answer_tokens(token_ids: Sequence[int], eos_ids: frozenset[int]) -> list[int]:
    """A finished answer's tokens as the store keeps them: the closing EOS dropped, so a
    later draft never proposes ending where the earlier answer ended."""
    tokens = list(token_ids)
    return tokens[:-1] if tokens and tokens[-1] in eos_ids else tokens


def _as_answer(tokens: Sequence[int] | np.ndarray) -> Answer:
    """Token ids as a hashable tuple of ints; a clear error for anything else."""
    if isinstance(tokens, (str, bytes, bytearray, memoryview)):
        raise TypeError(f"an answer is a sequence of token ids, got {type(tokens).__name__}")
    return tuple(integer("answer token id", t, low=0) for t in tokens)
