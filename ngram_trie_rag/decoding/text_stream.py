"""Incremental detokenisation: text deltas that never split a character or a stop string."""

from __future__ import annotations

from collections.abc import Sequence


class TextStream:
    """Turns a growing list of token ids into safe text deltas.

    Holds back (a) a trailing U+FFFD, which means a multi-byte character is not yet
    complete, and (b) any tail that could still grow into a stop string. When a stop
    string appears, the text is cut before it and ``stopped`` becomes true.
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self._tokenizer = tokenizer
        self.stops = tuple(stop)
        self.text = ""  # everything decoded so far (before any stop string)
        self.emitted = 0  # chars of ``text`` already handed out
        self.stopped = False

    def push(self, token_ids: Sequence[int]) -> str:
        """Decode all ids so far; return the new safe delta."""
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        cut = self._find_stop(text)
        if cut is not None:
            self.stopped = True
            self.text = text[:cut]
            return self._emit(len(self.text))
        self.text = text
        safe = len(text)
        if text.endswith("\ufffd"):
            safe -= 1
        safe -= self._partial_stop(text[:safe])
        return self._emit(safe)

    def finish(self) -> str:
        """Flush everything held back (end of generation)."""
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        delta = self.text[self.emitted : upto]
        self.emitted = upto
        return delta

    def _find_stop(self, text: str) -> int | None:
        # Only a stop string that ends in the unseen part can be new.
        start = max(0, self.emitted - max((len(s) for s in self.stops), default=0))
        hits = [i for s in self.stops if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None

    def _partial_stop(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
