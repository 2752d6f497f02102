"""Prompts and documents as token ids, checked, one tokenizer call at a time.

Fast tokenizers are not re-entrant ("Already borrowed" when two threads share one), and
every generator over a model shares its tokenizer, so encoding takes one lock per
tokenizer object (:func:`tokenizer_lock`): callers need no lock of their own.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
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
    """Prompt -> token ids: a string as-is; chat messages via the chat template (with
    ``chat_template_kwargs``, e.g. Qwen3's ``enable_thinking``), or for a model without
    one as the text :func:`messages_as_text` writes; token ids checked against the
    vocabulary."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
        return _encode_text(tokenizer, prompt)
    items = list(prompt)
    if not items:
        raise ValueError("prompt is empty")
    if all(isinstance(m, dict) for m in items):
        return _encode_messages(tokenizer, items, model_name, chat_template_kwargs or {})
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        bad = [t for t in items if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
        return items
    raise TypeError("prompt must be a string, a list of chat messages, or a list of token ids")


def has_chat_template(tokenizer: Any) -> bool:
    """Whether this tokenizer's model has a chat template.

    The one test every prompt builder asks (:func:`ngram_trie_rag.prompts.rag_request`,
    the benchmark's rows) and every chat entry point: instruction-tuned models ship a
    template; base models have none and take plain text written so that they continue it
    (chat messages as :func:`messages_as_text` writes them).
    """
    return bool(getattr(tokenizer, "chat_template", None))


#: The line a model without a chat template continues: the reply's role, left open.
ASSISTANT_CUE = "assistant:"


def messages_as_text(messages: Sequence[Mapping[str, Any]],
                     model_name: str = "the model") -> str:
    """Chat messages as the plain text a model without a chat template reads: one
    ``role: content`` line per message, then ``assistant:`` for the model to continue.

    Every entry point renders a base model's chat messages with this function, so a
    conversation reads the same whichever one sent it. The layout is LlamaIndex's default
    ``messages_to_prompt`` (what its ``HuggingFaceLLM`` users get), less the space after
    the last colon: as with the completion prompt's ``Answer:``, a prompt ending in a
    space leaves the model to start with a word that lacks its leading space. Gemma-3-270M
    asked "What is the capital of France?" answered "19th century" after ``assistant: ``
    and "The capital of France is Paris." after ``assistant:``; asked what language is
    spoken in Brazil, "100%" against "I speak Portuguese.".

    A base model has no end-of-turn token: having answered, it tends to write the next
    ``user:`` turn itself. Pass ``stop=["\\nuser:"]`` to end the answer there.
    ``model_name`` names the model in errors.
    """
    lines = [f"{m['role']}: {_text_content(m, model_name)}"
             for m in _checked_messages(messages)]
    return "\n".join([*lines, ASSISTANT_CUE])


def _text_content(message: Mapping[str, Any], model_name: str) -> str:
    """A message's text; a template may read structured content, plain text cannot."""
    content = message["content"]
    if not isinstance(content, str):
        raise ValueError(f"{model_name} reads chat messages as plain text (it has no chat "
                         "template): give each message's content as a string, got "
                         f"{type(content).__name__}")
    return content


def _checked_messages(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    """``messages``, once each has a role and content and its text is valid Unicode."""
    for m in messages:
        if "role" not in m or "content" not in m:
            raise ValueError(f"chat messages need 'role' and 'content', got keys {sorted(m)}")
        if isinstance(m["content"], str):
            valid_text(m["content"], "a chat message")
    return messages


def _encode_text(tokenizer: Any, text: str) -> list[int]:
    with tokenizer_lock(tokenizer):
        return list(tokenizer(valid_text(text, "prompt"))["input_ids"])


def _encode_messages(tokenizer: Any, messages: list[dict[str, Any]], model_name: str,
                     template_kwargs: dict[str, Any]) -> list[int]:
    """Through the model's chat template; without one, as :func:`messages_as_text`
    writes them, tokenised exactly as that string given as the prompt would be."""
    if not has_chat_template(tokenizer):
        return _encode_text(tokenizer, messages_as_text(messages, model_name))
    _checked_messages(messages)
    with tokenizer_lock(tokenizer):
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            tokenize=True, **template_kwargs)
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
