"""Follow-up requests reuse the cache of what they share with the previous one.

A chat's second question over the same passages repeats the system prompt and the
passages, often thousands of tokens: prefilling them again is most of its time to first
token. So the engine keeps the latest request's cache and, for the next prompt on the
same model, cuts it back to the longest common token prefix and prefills only the rest.
The kept rows are what a prefill of that prefix computes (keys and values at the same
positions, attending to the same tokens), so decoding continues as from a full prefill;
the rest is prefilled as one forward after them, the way a chunked prefill runs.

One sequence is kept per model, at most ``MAX_KEPT_TOKENS`` long (its memory is what the
request used anyway), and it is given up as soon as a new request takes it. Where the
cache cannot be cut back exactly (RoPE whose frequencies follow the sequence length,
rebuilt during decoding) nothing is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .kv_cache import crop

MIN_REUSE = 16  # fewer common tokens than this are prefilled again (not worth a crop)
MAX_KEPT_TOKENS = 32_768  # a longer sequence is not kept past its request


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixKeeper:
    """The latest request's KV (an :class:`~ngram_trie_rag.engine.protocol.KV`), offered
    to the next prompt. Used under the engine's lock: one request at a time."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._kept: Any = None

    def keep(self, kv: Any) -> None:
        """Offer ``kv`` (its ``ids`` name every cached row) to the next prompt."""
        self._kept = kv if self.enabled and kv.length <= MAX_KEPT_TOKENS else None

    def take(self, ids: Sequence[int]) -> tuple[Any, int]:
        """The kept KV cut back to what it shares with ``ids`` and how many rows that is,
        or ``(None, 0)``. The last prompt token is always prefilled again: its logits
        choose the first new token."""
        kv, self._kept = self._kept, None
        if kv is None:
            return None, 0
        common = min(common_prefix(kv.ids, ids), len(ids) - 1, kv.length)
        if common < MIN_REUSE:
            return None, 0
        crop(kv.cache, common)
        kv.length = common
        del kv.ids[common:]
        return kv, common
