"""LlamaIndex prompts as the model takes them: chat messages for its chat template, or
one string for a model without one.

Without a template, chat messages become the plain text every entry point gives such a
model (:func:`ngram_trie_rag.inputs.messages_as_text`), unless the LLM was given its own
``messages_to_prompt``; a custom ``completion_to_prompt`` is honoured too, as LlamaIndex
expects of any LLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llama_index.core.base.llms import generic_utils
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms.llm import default_completion_to_prompt
from ngram_trie_rag.inputs import messages_as_text

from .tools import template_messages

if TYPE_CHECKING:
    from .base import NGramTrieLLM

Prompt = str | list[dict[str, str]]


def chat_prompt(llm: NGramTrieLLM, messages: Sequence[ChatMessage]) -> Prompt:
    """Messages for the model's chat template, or one string when it has none; earlier
    tool calls and results rewritten into the template's roles (see ``tools``)."""
    messages = template_messages(messages)
    chat = [{"role": _role(m.role), "content": m.content or ""} for m in messages]
    if llm.uses_chat_template():
        return chat
    if llm.messages_to_prompt is not generic_utils.messages_to_prompt:  # a caller's own
        return llm.messages_to_prompt(messages)
    return messages_as_text(chat, llm.model_name or "the model")


def completion_prompt(llm: NGramTrieLLM, prompt: str, formatted: bool) -> Prompt:
    """A formatted prompt goes as-is; otherwise a chat model gets it as the user turn."""
    if formatted:
        return prompt
    if llm.completion_to_prompt is not default_completion_to_prompt:
        return llm.completion_to_prompt(prompt)
    if not llm.uses_chat_template():
        return prompt
    system = [{"role": "system", "content": llm.system_prompt}] if llm.system_prompt else []
    return [*system, {"role": "user", "content": prompt}]


def _role(role: MessageRole | str) -> str:
    return role.value if isinstance(role, MessageRole) else str(role)
