"""LangChain messages -> the ``{"role", "content"}`` dicts a chat template expects.

The model reads text only: image, audio, video and file blocks raise instead of being
dropped silently (an answer about a picture the model never saw would be worse than an
error). A message's ``name`` is ignored, as most chat templates have no place for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import BaseMessage, ChatMessage

ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool",
         "function": "function", "developer": "system"}
NON_TEXT = {"image", "image_url", "audio", "input_audio", "video", "file"}


def message_text(message: BaseMessage) -> str:
    """The message's text; rejects media blocks the model cannot read."""
    if isinstance(message.content, list):
        for block in message.content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in NON_TEXT:
                raise ValueError(f"{kind!r} content is not supported: this model reads text only")
    return message.text


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """Chat-template input for ``messages``, roles mapped to the usual names."""
    chat = []
    for message in messages:
        role = message.role if isinstance(message, ChatMessage) else ROLES.get(message.type)
        if role is None:
            raise ValueError(f"unsupported message type {message.type!r}")
        chat.append({"role": role, "content": message_text(message)})
    return chat
