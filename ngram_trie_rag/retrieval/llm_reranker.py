"""``LLMReranker``: passage relevance from a causal LM, no reranker weights needed.

Two scoring methods, both one forward pass per (query, passage):

``method="query_likelihood"`` (default; UPR, Sachan et al. 2022): the mean log-probability
of the query's tokens after "Passage: {passage}\\nPlease write a question based on this
passage.\\nQuestion:". It needs no instruction following, only language modelling, so it
works with the project's 135M default model.

``method="yes_no"`` (the bge-reranker-v2-gemma recipe). The prompt

    Query: {query}
    Passage: {passage}
    Does the passage answer the query? Answer yes or no.
    Answer:

is scored by logsumexp(logits of " yes"/" Yes") - logsumexp(logits of " no"/" No") at the
last position: the log-odds of "yes" among the two answers. It needs an LLM that follows
the instruction; SmolLM2-135M does not (measured in docs/retrieval.md: it ranks the gold
passage first less often than no reranking at all), hence it is not the default.

Batching uses left padding with explicit position ids (the count of real tokens so far),
so a padded prompt gets the same positions, hence the same score up to float rounding, as
when it runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from .reranker_base import BaseReranker

DEFAULT_PROMPT = (
    "Query: {query}\nPassage: {passage}\n"
    "Does the passage answer the query? Answer yes or no.\nAnswer:"
)
QUERY_LIKELIHOOD_PROMPT = (
    "Passage: {passage}\nPlease write a question based on this passage.\nQuestion:"
)
YES_WORDS = (" yes", " Yes")
NO_WORDS = (" no", " No")
Method = Literal["yes_no", "query_likelihood"]


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
    """Scores passages with a causal LM; ``model=None`` loads the project's default LLM."""

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        method: Method = "query_likelihood",
        prompt: str | None = None,
        batch_size: int = 8,
        max_passage_tokens: int = 256,
        max_query_tokens: int = 64,
    ) -> None:
        if (model is None) != (tokenizer is None):
            raise ValueError("pass both model and tokenizer, or neither for the default LLM")
        if method not in ("yes_no", "query_likelihood"):
            raise ValueError(f"method must be 'yes_no' or 'query_likelihood', got {method!r}")
        default = DEFAULT_PROMPT if method == "yes_no" else QUERY_LIKELIHOOD_PROMPT
        prompt = prompt or default
        needed = ("{query}", "{passage}") if method == "yes_no" else ("{passage}",)
        if any(field not in prompt for field in needed):
            raise ValueError(f"prompt must contain {' and '.join(needed)}")
        self._model, self._tokenizer = model, tokenizer
        self.method = method
        self.prompt = prompt
        self.batch_size = batch_size
        self.max_passage_tokens = max_passage_tokens
        self.max_query_tokens = max_query_tokens
        self._yes: list[int] | None = None
        self._no: list[int] | None = None

    def __repr__(self) -> str:
        return f"LLMReranker(method={self.method!r})"

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

    def _clean_query(self, query: str) -> str:
        return self._truncate(" ".join(query.split()), self.max_query_tokens)

    def build_prompt(self, query: str, passage: str) -> str:
        """The text the model reads for one pair (for ``query_likelihood``: before the query)."""
        self._ensure_model()
        return self.prompt.format(
            query=self._clean_query(query),
            passage=self._truncate(" ".join(passage.split()), self.max_passage_tokens),
        )

    def _forward_tail(self, batch: list[list[int]], keep: int) -> Any:
        """Logits at the last ``keep`` positions of each (left-padded) sequence: (B, keep, V)."""
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
                logits = model(**inputs, logits_to_keep=keep).logits
            except TypeError:  # models without logits_to_keep
                logits = model(**inputs).logits
        return logits[:, -keep:, :].float()

    def _score_batch(self, batch: list[list[int]], query_ids: list[int]) -> np.ndarray:
        import torch

        if self.method == "yes_no":
            logits = self._forward_tail(batch, 1)[:, -1, :]
            yes = torch.logsumexp(logits[:, self._yes], dim=-1)
            no = torch.logsumexp(logits[:, self._no], dim=-1)
            return (yes - no).cpu().numpy()
        # query_likelihood: position t predicts token t+1, so the query's tokens are
        # predicted by the len(query)+1 .. 2nd-to-last positions.
        n = len(query_ids)
        logprobs = self._forward_tail(batch, n + 1)[:, :-1, :].log_softmax(-1)
        target = torch.tensor(query_ids, device=logprobs.device).expand(len(batch), n)
        return logprobs.gather(-1, target[..., None])[..., 0].mean(-1).cpu().numpy()

    def _encode(self, query: str, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Token ids per passage (query appended for ``query_likelihood``) and query ids."""
        tok = self._tokenizer
        if self.method == "yes_no":
            return [tok(self.build_prompt(query, t))["input_ids"] for t in texts], []
        query_ids = tok.encode(" " + self._clean_query(query), add_special_tokens=False)
        if not query_ids:
            raise ValueError("query_likelihood needs a non-empty query")
        encoded = [tok(self.build_prompt(query, t))["input_ids"] + query_ids for t in texts]
        return encoded, query_ids

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        self._ensure_model()
        if not texts:
            return np.zeros(0, dtype=np.float32)
        encoded, query_ids = self._encode(query, texts)
        # Batch prompts of similar length together: less padding, less wasted compute.
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        scores = np.zeros(len(encoded), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            scores[chunk] = self._score_batch([encoded[i] for i in chunk], query_ids)
        return scores
