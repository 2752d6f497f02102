"""The repetition stop for Hugging Face ``generate``, so its answers end where ours do.

This library's generator takes ``repetition_stop=n``; a plain ``generate`` call (the
greedy reference, the benchmark's ``vanilla`` and ``hf-pld``) gets
:class:`RepetitionCriteria`, which ends it once
:class:`~ngram_trie_rag.decoding.repetition.RepeatScan` finds a cut among the new tokens; the
tokens are then cut at that point
(:func:`~ngram_trie_rag.decoding.repetition.cut_answer`). Both return the same prefix of the greedy
answer, so exactness still compares like with like, and no decoder spends its time on a
loop the others skip.
"""

from __future__ import annotations

import torch
from transformers import StoppingCriteria

from .repetition import RepeatScan


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
