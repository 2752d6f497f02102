"""Token choice at tree nodes, greedy or sampled (the walks that use it:
:mod:`ngram_trie_rag.engine.acceptance`).

Acceptance rule (the multi-draft rule of SpecInfer / SGLang for deterministic drafts):
at the current node draw x ~ p(. | path) -- argmax for greedy -- then descend to the
child whose token is x if there is one, else emit x and stop. Every emitted token is
a genuine draw from the model's distribution at its prefix, so the output
distribution equals plain sampling, and greedy output equals plain greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 mean no truncation."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature, top-k, top-p.

    Same order as Hugging Face's warpers: temperature, then top-k, then top-p.
    """
    scores = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop = cum - sorted_scores.softmax(-1) >= params.top_p  # keep the token crossing top_p
        drop[..., 0] = False  # and the most likely one, even when top_p rounds to 0 in fp32
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    return scores.softmax(-1)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from (V,) logits."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = probabilities(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))
