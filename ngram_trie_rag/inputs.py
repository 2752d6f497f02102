"""Prompts and documents as token ids, checked, one tokenizer call at a time.

Fast tokenizers are not re-entrant ("Already borrowed" when two threads share one), and
every generator over a model shares its tokenizer, so encoding takes one lock per
tokenizer object (:func:`tokenizer_lock`): callers need no lock of their own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from .validation import valid_text

Prompt = str | Sequence[dict[str, Any]] | Sequence[int]
# What a call drafts from: a text, or token ids (retrieval's loaded files and the
# frameworks' documents are other types, turned into these by their adapters).
DraftDocument = str | Sequence[int]

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(tokenizer: Any) -> threading.Lock:
    """The lock serialising calls into ``tokenizer`` (one per tokenizer object)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(tokenizer)
        if lock is None:
            lock = _LOCKS[tokenizer] = threading.Lock()
        return lock


def encode_prompt(tokenizer: Any, prompt: Prompt, vocab_size: int,
                  model_name: str = "model",
                  chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Prompt -> token ids: a string as-is, chat messages via the chat template (with
    ``chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``), token ids checked against
    the vocabulary."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
        with tokenizer_lock(tokenizer):
            return list(tokenizer(valid_text(prompt, "prompt"))["input_ids"])
    items = list(prompt)
    if not items:
        raise ValueError("prompt is empty")
    if all(isinstance(m, dict) for m in items):
        return _apply_chat_template(tokenizer, items, model_name, chat_template_kwargs or {})
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        bad = [t for t in items if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
        return items
    raise TypeError("prompt must be a string, a list of chat messages, or a list of token ids")


def has_chat_template(tokenizer: Any) -> bool:
    """Whether chat messages can be sent to this tokenizer's model.

    The one test every prompt builder asks (:func:`ngram_trie_rag.prompts.rag_request`,
    the benchmark's rows): instruction-tuned models ship a template; base models have
    none and take plain text written so that they continue it.
    """
    return bool(getattr(tokenizer, "chat_template", None))


def _apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]],
                         model_name: str, template_kwargs: dict[str, Any]) -> list[int]:
    # Never a silent fallback: flattening messages into text is a prompt format the
    # caller did not choose. Builders that know their prompt pick the form up front.
    if not has_chat_template(tokenizer):
        raise ValueError(f"{model_name} has no chat template; pass a string prompt")
    for m in messages:
        if "role" not in m or "content" not in m:
            raise ValueError(f"chat messages need 'role' and 'content', got keys {sorted(m)}")
        if isinstance(m["content"], str):
            valid_text(m["content"], "a chat message")
    with tokenizer_lock(tokenizer):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            **template_kwargs)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


def encode_documents(tokenizer: Any, documents: Sequence[DraftDocument]) -> list[list[int]]:
    """Settled documents (:func:`ngram_trie_rag.validation.check_documents`: kinds, blanks
    and repeats are settled there, once) -> token ids, texts in one tokenizer call.
    Documents are only drafted from, never fed to the model, so any length is accepted
    (the trie's token bound applies)."""
    texts = [d for d in documents if isinstance(d, str)]
    with tokenizer_lock(tokenizer):
        encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    return [list(next(encoded)) if isinstance(d, str) else list(d) for d in documents]


class ContextWindowError(ValueError):
    """A prompt with no room left in the model's context window; ``tokens`` and ``window``
    let a caller say it in its own terms (the command line names ``--k``)."""

    def __init__(self, tokens: int, window: int, model_name: str) -> None:
        super().__init__(f"prompt has {tokens} tokens; the context window of {model_name} "
                         f"is {window}")
        self.tokens, self.window = tokens, window


def fit_context(ids: list[int], window: int, model_name: str = "model") -> list[int]:
    """``ids`` if the model can read them and still answer (at least one new token fits),
    else a :class:`ContextWindowError`."""
    if len(ids) >= window:
        raise ContextWindowError(len(ids), window, model_name)
    return ids
