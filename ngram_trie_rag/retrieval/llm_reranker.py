"""``LLMReranker``: relevance from a causal LM's next-token logits for " yes" vs " no".

This is the bge-reranker-v2-gemma recipe with any causal LM, so reranking works with the
project's default model and needs no extra weights. For each passage the prompt

    Query: {query}
    Passage: {passage}
    Does the passage answer the query? Answer yes or no.
    Answer:

is run once; the score is logsumexp(logits of the "yes" tokens) - logsumexp(logits of the
"no" tokens) at the last position, i.e. the log-odds of "yes" among the two answers.

Batching uses left padding with explicit position ids (count of real tokens so far), so a
padded prompt gets the same positions, hence nearly the same score, as when run alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .reranker_base import BaseReranker

DEFAULT_PROMPT = (
    "Query: {query}\nPassage: {passage}\n"
    "Does the passage answer the query? Answer yes or no.\nAnswer:"
)
YES_WORDS = (" yes", " Yes")
NO_WORDS = (" no", " No")


def answer_token_ids(tokenizer: Any, words: Sequence[str]) -> list[int]:
    """First token of each answer word, deduplicated (" yes" is one token in most vocabs)."""
    ids: list[int] = []
    for word in words:
        tokens = tokenizer.encode(word, add_special_tokens=False)
        if tokens and tokens[0] not in ids:
            ids.append(tokens[0])
    if not ids:
        raise ValueError(f"the tokenizer encodes none of {words!r}")
    return ids


class LLMReranker(BaseReranker):
    """Scores passages with a causal LM's yes/no log-odds; ``model=None`` loads the default."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        prompt: str = DEFAULT_PROMPT,
        batch_size: int = 8,
        max_passage_tokens: int = 256,
        max_query_tokens: int = 64,
    ) -> None:
        if (model is None) != (tokenizer is None):
            raise ValueError("pass both model and tokenizer, or neither for the default LLM")
        if "{query}" not in prompt or "{passage}" not in prompt:
            raise ValueError("prompt must contain {query} and {passage}")
        self._model, self._tokenizer = model, tokenizer
        self.prompt = prompt
        self.batch_size = batch_size
        self.max_passage_tokens = max_passage_tokens
        self.max_query_tokens = max_query_tokens
        self._yes: list[int] | None = None
        self._no: list[int] | None = None

    def _ensure_model(self) -> None:
        if self._model is None:
            from ngram_trie_rag.loading import load_model

            self._model, self._tokenizer = load_model()
        if self._yes is None:
            self._yes = answer_token_ids(self._tokenizer, YES_WORDS)
            self._no = answer_token_ids(self._tokenizer, NO_WORDS)

    @property
    def model(self) -> Any:
        self._ensure_model()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self._ensure_model()
        return self._tokenizer

    def _truncate(self, text: str, max_tokens: int) -> str:
        """Cut long inputs by tokens so the question and instruction are never cut off."""
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        return self._tokenizer.decode(ids[:max_tokens])

    def build_prompt(self, query: str, passage: str) -> str:
        self._ensure_model()
        return self.prompt.format(
            query=self._truncate(query.strip(), self.max_query_tokens),
            passage=self._truncate(" ".join(passage.split()), self.max_passage_tokens),
        )

    def _encode_prompt(self, prompt: str) -> list[int]:
        """Prompt token ids, with BOS when the tokenizer normally adds one."""
        return self._tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def _batch_scores(self, batch: list[list[int]]) -> np.ndarray:
        import torch

        model = self._model
        device = next(model.parameters()).device
        width = max(len(ids) for ids in batch)
        pad_id = self._tokenizer.pad_token_id
        pad_id = pad_id if pad_id is not None else self._tokenizer.eos_token_id or 0
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding: real tokens end at the last column
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            mask[row, width - len(ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        inputs = {
            "input_ids": input_ids.to(device),
            "attention_mask": mask.to(device),
            "position_ids": positions.to(device),
            "use_cache": False,
        }
        with torch.inference_mode():
            try:
                logits = model(**inputs, logits_to_keep=1).logits[:, -1, :]
            except TypeError:  # models without logits_to_keep
                logits = model(**inputs).logits[:, -1, :]
        logits = logits.float()
        yes = torch.logsumexp(logits[:, self._yes], dim=-1)
        no = torch.logsumexp(logits[:, self._no], dim=-1)
        return (yes - no).cpu().numpy()

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        self._ensure_model()
        if not texts:
            return np.zeros(0, dtype=np.float32)
        encoded = [self._encode_prompt(self.build_prompt(query, text)) for text in texts]
        # Batch prompts of similar length together: less padding, less wasted compute.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        scores = np.zeros(len(encoded), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            scores[chunk] = self._batch_scores([encoded[i] for i in chunk])
        return scores
