"""The repetition stop for Hugging Face ``generate``, so every method ends alike.

This library's methods take ``repetition_stop=n``; ``vanilla`` and ``hf-pld`` get a
stopping criterion that ends ``generate`` once :func:`~ngram_trie_rag.repetition.repeat_cut`
finds a cut among the new tokens, and their tokens are then cut at that point. All
methods then return the same prefix of the greedy answer, so exactness still compares
like with like, and no method spends its time on a loop the others skip.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria

from ..repetition import RepeatScan, repeat_cut


class RepetitionCriteria(StoppingCriteria):
    """Stops one ``generate`` call (batch of one) at the first repeated n-gram of its
    answer. Only the tokens added since the last call are scanned."""

    def __init__(self, n: int, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.scan = RepeatScan(n)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None,
                 **kwargs: object) -> torch.BoolTensor:
        seen = self.prompt_tokens + len(self.scan.tokens)
        found = self.scan.feed(input_ids[0, seen:].tolist()) is not None
        return torch.full((input_ids.shape[0],), found, dtype=torch.bool,
                          device=input_ids.device)


def cut_answer(tokens: list[int], n: int | None) -> tuple[list[int], bool]:
    """``tokens`` up to their first repeated n-gram (all of them when ``n`` is None or
    nothing repeats), and whether a cut was made."""
    cut = repeat_cut(tokens, n) if n is not None else None
    return (tokens, False) if cut is None else (tokens[:cut], True)
