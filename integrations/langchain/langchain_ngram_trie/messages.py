"""LangChain messages -> the ``{"role", "content"}`` dicts a chat template expects (and
that a model without one reads as plain text, ``role: content`` lines).

The model reads text only: image, audio, video and file blocks raise instead of being
dropped silently (an answer about a picture the model never saw would be worse than an
error). A message's ``name`` is ignored, as most chat templates have no place for it.

Tool turns are written the way the model writes and reads them under a tool-call grammar
(:mod:`ngram_trie_rag.wrappers.tool_calls`): an AI message's calls as the JSON reply it produced
(``{"tool_calls": [{"name", "arguments"}]}``, its text, if any, under ``"content"``), and a
tool result as a ``tool`` turn naming the tool and the call it answers, so a conversation
with earlier calls reads the same whichever model made them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage

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


def ai_calls_text(message: AIMessage) -> str:
    """An AI message with tool calls as the JSON reply the model writes for them."""
    reply: dict[str, object] = {}
    text = message_text(message)
    if text:
        reply["content"] = text
    reply["tool_calls"] = [{"name": c["name"], "arguments": c["args"]}
                           for c in message.tool_calls]
    return json.dumps(reply, ensure_ascii=False)


def tool_result_text(message: ToolMessage, names: dict[str, str]) -> str:
    """A tool result naming the tool and the call (``names``: call id -> tool name, for
    results that do not carry their tool's name)."""
    name = message.name or names.get(message.tool_call_id, "the tool")
    what = "Error from" if message.status == "error" else "Result of"
    return f"{what} {name} (call {message.tool_call_id}): {message_text(message)}"


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """Chat-template input for ``messages``, roles mapped to the usual names."""
    chat = []
    names: dict[str, str] = {}  # tool call id -> tool name, from the calls seen so far
    for message in messages:
        role = message.role if isinstance(message, ChatMessage) else ROLES.get(message.type)
        if role is None:
            raise ValueError(f"unsupported message type {message.type!r}")
        if isinstance(message, AIMessage) and message.tool_calls:
            names.update({c["id"]: c["name"] for c in message.tool_calls if c["id"]})
            content = ai_calls_text(message)
        elif isinstance(message, ToolMessage):
            content = tool_result_text(message, names)
        else:
            content = message_text(message)
        chat.append({"role": role, "content": content})
    return chat


def with_instruction(chat: list[dict[str, str]], instruction: str | None) -> list[dict[str, str]]:
    """``chat`` with ``instruction`` appended to its system message (one is added first
    when there is none: templates expect a single system turn, at the start)."""
    if not instruction:
        return chat
    if chat and chat[0]["role"] == "system":
        first = chat[0]["content"]
        merged = f"{first}\n\n{instruction}" if first else instruction
        return [{"role": "system", "content": merged}, *chat[1:]]
    return [{"role": "system", "content": instruction}, *chat]
