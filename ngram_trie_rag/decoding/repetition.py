"""The repetition stop: end an answer once it starts repeating itself.

Small models loop ("X is Y. X is Y. X is Y." up to the token limit). With a window
``n`` the answer ends just before the first n-gram that already occurred, wholly before
it, earlier in the answer. The rule looks only at the tokens, so it applies the same way
to any decoder's output: the kept answer is a **prefix** of what plain greedy decoding
makes, and speculative output stays exact against a reference cut by the same rule.

Streaming must never hand out a token that a later cut removes. A cut at ``j`` needs the
n-gram starting at ``j`` to have occurred wholly before, so while the answer's tail
``tokens[j:]`` is shorter than ``n``, ``j`` can still become a cut only if that tail
begins some earlier n-gram (one starting at or before ``j - n``). :class:`RepetitionStop`
releases every token before the first such ``j``: in text that does not repeat itself
that holds back a token or two, not ``n - 1``, so the first words show as soon as they
are decoded.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..validation import integer
from .result import FinishReason, GenerationStats

NGram = tuple[int, ...]

# The window used unless told otherwise (command line, wrappers): a repeated run of 12 tokens is
# a loop, not a phrase an answer legitimately says twice ("the error E2 ...").
DEFAULT_N = 12


def repeat_cut(tokens: Sequence[int], n: int, start: int = 0,
               seen: dict[NGram, int] | None = None) -> int | None:
    """Where to cut ``tokens`` so that no n-gram in it repeats, or ``None``.

    Scanning positions ``t = start, start + 1, ...`` in order, the first ``t`` whose
    n-gram ``tokens[t - n + 1 : t + 1]`` occurred earlier wholly before it (ending at some
    ``t' <= t - n``) gives the cut ``t - n + 1``: keep ``tokens[:cut]``, everything before
    the repeated n-gram began. Overlapping occurrences (a run like ``7 7 7`` for ``n=2``)
    do not count until one lies wholly before the other.

    Example, ``n = 3``::

        tokens  5 1 2 3 9 1 2 3 1 2 3
        index   0 1 2 3 4 5 6 7 8 9 10

    ``1 2 3`` ends at 3 and again at 7 (``7 - 3 = 4 >= 3``): the cut is ``7 - 3 + 1 = 5``
    and the answer keeps ``5 1 2 3 9``.

    ``seen`` (n-gram -> the position its first occurrence ends at) makes repeated calls
    cost only the new positions: pass the same dict each time with ``start`` = the first
    position not scanned yet. Without it, the n-grams ending before ``start`` are indexed
    (not checked) first.
    """
    if seen is None:
        seen = {}
        for t in range(n - 1, min(start, len(tokens))):
            seen.setdefault(tuple(tokens[t - n + 1 : t + 1]), t)
    for t in range(max(start, n - 1), len(tokens)):
        gram = tuple(tokens[t - n + 1 : t + 1])
        first = seen.setdefault(gram, t)
        if first <= t - n:
            return t - n + 1
    return None


def check_repetition_stop(value: object) -> int | None:
    """``None`` (off) or an n-gram length of at least 2: one repeated token is often
    legitimate ("1 1"), and a bool is never what a caller meant."""
    if value is None:
        return None
    return integer("repetition_stop", value, low=2)


def trim_steps(sizes: Sequence[int], total: int) -> list[int]:
    """Per-step token counts cut back to add up to at most ``total``: the steps that made
    only tokens past a cut go, the step the cut falls in keeps its share. So the counts
    describe the answer that is returned, as they do without a cut."""
    out: list[int] = []
    left = total
    for size in sizes:
        if left <= 0:
            break
        out.append(min(size, left))
        left -= out[-1]
    return out


class RepeatScan:
    """An answer fed step by step, checked for its first repeated n-gram.

    It keeps the answer so far and the first end position of every n-gram, so each
    :meth:`feed` costs only the new tokens (:func:`repeat_cut` with a shared ``seen``).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.tokens: list[int] = []
        self._seen: dict[NGram, int] = {}

    def feed(self, tokens: Sequence[int]) -> int | None:
        """Add ``tokens``; the cut, once the answer repeats itself, else ``None``."""
        start = len(self.tokens)
        self.tokens.extend(tokens)
        return repeat_cut(self.tokens, self.n, start, self._seen)


class RepetitionStop(RepeatScan):
    """One request's repetition check, fed the tokens of every decode step in order;
    it releases only tokens no later cut can remove."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.released = 0  # tokens handed out so far
        # Every run of 1..n-1 tokens -> where it first starts (runs of different lengths
        # are different keys): what a tail shorter than n is looked up in.
        self._starts: dict[NGram, int] = {}

    def emit(self, tokens: Sequence[int], finish: FinishReason | None,
             stats: GenerationStats) -> tuple[list[int], FinishReason | None]:
        """Add a step's tokens; return what may leave now and the finish reason
        (``"repetition"`` on a cut, whose stats are trimmed to the kept answer)."""
        start = len(self.tokens)
        cut = self.feed(tokens)
        if cut is not None:
            del self.tokens[cut:]
            finish = "repetition"
            stats.accept_lengths[:] = trim_steps(stats.accept_lengths, cut - 1)
            del stats.draft_sizes[len(stats.accept_lengths):]
        end = len(self.tokens) if finish is not None else self._final(start)
        out = self.tokens[self.released : max(end, self.released)]
        self.released += len(out)
        return out, finish

    def _final(self, start: int) -> int:
        """How many tokens no later cut can remove, after tokens from ``start`` on were
        added without a cut: the first ``j`` whose tail ``tokens[j:]`` (shorter than n)
        began an n-gram starting at or before ``j - n``, else all of them."""
        tokens, n = self.tokens, self.n
        for p in range(start, len(tokens)):  # index the runs ending at each new token
            for m in range(1, min(n - 1, p + 1) + 1):
                self._starts.setdefault(tuple(tokens[p - m + 1 : p + 1]), p - m + 1)
        for j in range(max(len(tokens) - n + 1, n), len(tokens)):  # earliest first
            first = self._starts[tuple(tokens[j:])]
            if first <= j - n:
                return j
        return len(tokens)


def cut_answer(tokens: list[int], n: int | None) -> tuple[list[int], bool]:
    """``tokens`` up to their first repeated n-gram (all of them when ``n`` is None or
    nothing repeats), and whether a cut was made: a finished answer cut by the same rule
    :class:`RepetitionStop` applies while streaming."""
    cut = repeat_cut(tokens, n) if n is not None else None
    return (tokens, False) if cut is None else (tokens[:cut], True)
