"""Closing a grammar-constrained answer that must end early, so that it still parses.

An answer under a grammar (a JSON schema for structured output, a tool call) can be cut
before the structure is complete: by the token budget, or by the repetition stop when a
small model loops inside a string. A cut object does not parse, and the caller gets an
error instead of an answer. So the answer is closed instead: from the grammar's state
after the kept tokens, a short completion the grammar accepts is appended, made of
tokens chosen by the grammar alone (no model call), in this order of preference:

1. a token that ends a structure (``"``, ``}``, ``]``), separates (``,``, ``:``) or is
   the smallest value (``0``, ``false``, ``null``), in that order;
2. else the allowed token with the longest text that is not only whitespace (the lowest
   id among equals): where the grammar fixes what follows (a required key, a literal,
   an enum value) the fewest tokens spell it; whitespace only where nothing else fits.

It ends as soon as the grammar may stop. This is a greedy walk, not a search: it finds
the shortest completion for JSON (close the string, fill each missing required field
with its smallest value, close the brackets) and a completion for most other grammars;
where none comes within the limit it returns None and the answer is left as cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

# Texts tried first, in order: ends, separators, then the smallest values.
PREFERRED = ('"', "}", "]", ",", ":", "0", "false", "null")
UNUSABLE = -1  # the rank of tokens never chosen by length (empty, special)
WHITESPACE = 0  # whitespace-only texts: chosen only when nothing else is allowed


class ClosingVocab:
    """Per tokenizer: the preferred tokens, and each token's rank by length (its text
    length; whitespace 0, unusable -1)."""

    def __init__(self, decoded_vocab: Sequence[bytes], special: Sequence[int]) -> None:
        texts = [t for text in PREFERRED for t in (text, " " + text)]  # "0" before " 0"
        ids: dict[bytes, list[int]] = {text.encode(): [] for text in texts}
        lengths = torch.full((len(decoded_vocab),), UNUSABLE, dtype=torch.int32)
        for tok, text in enumerate(decoded_vocab):
            if text in ids:
                ids[text].append(tok)
            if text and tok not in special:
                lengths[tok] = len(text) if text.strip() else WHITESPACE
        self.preferred = np.array([t for text in texts for t in ids[text.encode()]],
                                  dtype=np.int64)
        for tok in special:
            lengths[tok] = UNUSABLE
        self.lengths = lengths.numpy()  # (V,)


def closing(matcher: Any, fill: Callable[[Any], torch.Tensor], vocab: ClosingVocab,
            stop_ids: Sequence[int], limit: int) -> list[int] | None:
    """The tokens that close ``matcher``'s structure (the matcher is moved along: pass a
    fork), at most ``limit`` of them, or None. ``fill(matcher)``: (1, W) int32, what may
    follow now, bit ``t % 32`` of word ``t // 32`` for token ``t``."""
    out: list[int] = []
    stops = np.array(list(stop_ids), dtype=np.int64)
    while True:
        if matcher.is_terminated():
            return out
        mask = unpack(fill(matcher)[0], len(vocab.lengths))
        if stops.size and mask[stops].any():  # the grammar may end here
            return out
        if len(out) == limit:
            return None
        tok = _next(mask, vocab)
        if tok is None or not matcher.accept_token(tok):
            return None
        out.append(tok)


def unpack(words: torch.Tensor, vocab_size: int) -> np.ndarray:
    """(W,) int32 packed bits -> (V,) bool, bit ``t % 32`` of word ``t // 32`` (numpy's
    bit unpacking: far cheaper than shifting a (W, 32) tensor)."""
    raw = words.numpy().astype("<i4", copy=False).view(np.uint8)
    return np.unpackbits(raw, bitorder="little")[:vocab_size].astype(bool)


def _next(mask: np.ndarray, vocab: ClosingVocab) -> int | None:
    """The walk's choice among the tokens ``mask`` allows (see the module docstring)."""
    preferred = vocab.preferred[mask[vocab.preferred]]
    if preferred.size:
        return int(preferred[0])
    lengths = np.where(mask, vocab.lengths, UNUSABLE)
    tok = int(lengths.argmax())
    return None if lengths[tok] == UNUSABLE else tok
