"""Tool calling for a model with no tool-call format of its own.

The model is told about the tools in a system message and replies with one JSON object,
``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` or ``{"content": "..."}``, which a
grammar built from the tools' schemas enforces (``ngram_trie_rag.wrappers.tool_calls``); so every
reply parses, and the arguments are valid for the tool they name.

This module translates between that reply shape and LlamaIndex's: ``BaseTool`` ->
``ToolSpec``, ``tool_required`` / ``tool_choice`` -> the grammar's ``choice``, a reply ->
``ToolCallBlock``s plus ``additional_kwargs["tool_calls"]``, and back: a conversation that
holds earlier calls and their results is rewritten into the roles a chat template knows
(an assistant turn in the reply shape, a tool result as a user turn naming the tool), so
the model reads its own calls the way it wrote them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    MessageRole,
    TextBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection
from ngram_trie_rag.wrappers.tool_calls import ToolCall, ToolSpec, parse_reply, tools_system_prompt

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

_CHOICES = ("auto", "required", "any", "none")
_CALLS_START = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')


def tool_spec(tool: BaseTool) -> ToolSpec:
    """A LlamaIndex tool as the grammar sees it (``$ref``s inlined: the arguments schema is
    nested inside the reply's schema, where a root-relative ``$ref`` would dangle)."""
    meta = tool.metadata
    return ToolSpec(meta.get_name(), meta.description, inline_refs(meta.get_parameters_dict()))


def inline_refs(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with every ``#/$defs/X`` (or ``#/definitions/X``) replaced by its target.

    Recursive models cannot be inlined: they raise ValueError.
    """
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
            name = ref.rsplit("/", 1)[-1]
            if name in seen or name not in defs:
                raise ValueError(f"cannot inline the JSON schema reference {ref!r}")
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return {**resolve(defs[name], (*seen, name)), **resolve(rest, seen)}
        return {k: resolve(v, seen) for k, v in node.items()
                if k not in ("$defs", "definitions")}

    return resolve(dict(schema), ())


def tool_choice(specs: Sequence[ToolSpec], tool_required: bool, choice: Any = None) -> str:
    """The grammar's choice from LlamaIndex's arguments.

    ``choice`` (``tool_choice=`` in the call, as FunctionAgent's ``initial_tool_choice``
    sends it): "auto", "required"/"any", "none", a tool name, or OpenAI's
    ``{"type": "function", "function": {"name": ...}}``. ``tool_required`` turns "auto"
    into "required".
    """
    if isinstance(choice, Mapping):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if choice is None:
        choice = "auto"
    names = [s.name for s in specs]
    if not isinstance(choice, str) or (choice not in _CHOICES and choice not in names):
        raise ValueError(f"tool_choice {choice!r} is not 'auto', 'required', 'none' or "
                         f"an offered tool; tools: {names}")
    if choice == "any":
        choice = "required"
    return "required" if tool_required and choice == "auto" else choice


def with_tools_prompt(messages: Sequence[ChatMessage], specs: Sequence[ToolSpec],
                      choice: str) -> list[ChatMessage]:
    """The conversation with the tools described in its (first) system message."""
    text = tools_system_prompt(specs, choice)
    messages = list(messages)
    if messages and messages[0].role == MessageRole.SYSTEM and messages[0].content:
        text = f"{messages[0].content}\n\n{text}"
        messages = messages[1:]
    return [ChatMessage(role=MessageRole.SYSTEM, content=text), *messages]


# ---- reply -> LlamaIndex --------------------------------------------------------------
def reply_message(text: str,
                  parsed: tuple[str, Sequence[ToolCall]] | None = None) -> ChatMessage:
    """An assistant message from a reply: its content, and its calls both as
    ``ToolCallBlock``s and in ``additional_kwargs["tool_calls"]``.

    ``parsed``: the reply's (content, calls) when the backend parsed it already (parsing
    again would name the calls with new ids). A reply cut by the token limit is not valid
    JSON: its complete calls are kept (a small model allowed parallel calls tends to
    repeat one until the limit), or the answer text written so far; anything else stays
    as the raw text.
    """
    content, calls = parsed if parsed is not None else parse_reply(text)
    calls = list(calls)
    if not calls and content == text:  # not a reply object: cut, most likely
        calls = complete_calls(text)
        content = "" if calls else (streamed_content(text) or text)
    blocks: list[Any] = [TextBlock(text=content)] if content else []
    blocks += [ToolCallBlock(tool_call_id=c.id, tool_name=c.name, tool_kwargs=c.arguments)
               for c in calls]
    extra = {"tool_calls": [_openai_call(c) for c in calls]} if calls else {}
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks, additional_kwargs=extra)


def complete_calls(text: str) -> list[ToolCall]:
    """The whole call objects at the start of a cut ``{"tool_calls": [...`` reply."""
    head = text.lstrip()
    start = _CALLS_START.match(head)
    if start is None:
        return []
    decoder, pos, items = json.JSONDecoder(), start.end(), []
    while True:
        pos += len(head[pos:]) - len(head[pos:].lstrip(" \t\n\r,"))  # to the next call
        try:
            item, pos = decoder.raw_decode(head, pos)
        except json.JSONDecodeError:
            break
        items.append(item)
    _, calls = parse_reply(json.dumps({"tool_calls": items}))
    return calls


def _openai_call(call: ToolCall) -> dict[str, Any]:
    """The widely read OpenAI shape: arguments as JSON text."""
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}


def tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The calls a message carries, in any of the shapes LlamaIndex code writes them."""
    found = [_selection(c) for c in message.additional_kwargs.get("tool_calls") or []]
    if not found:
        found = [ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name,
                               tool_kwargs=_arguments(b.tool_kwargs))
                 for b in message.blocks if isinstance(b, ToolCallBlock)]
    return found


def _selection(call: Any) -> ToolSelection:
    if isinstance(call, ToolSelection):
        return call
    if not isinstance(call, Mapping):  # an SDK object (e.g. OpenAI's), read by attribute
        call = {"id": getattr(call, "id", ""), "function": getattr(call, "function", None)}
    function = call.get("function") or call
    if not isinstance(function, Mapping):
        function = {"name": getattr(function, "name", ""),
                    "arguments": getattr(function, "arguments", {})}
    return ToolSelection(tool_id=str(call.get("id") or ""), tool_name=str(function["name"]),
                         tool_kwargs=_arguments(function.get("arguments")))


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return {}
    return dict(raw) if isinstance(raw, Mapping) else {}


def streamed_content(text: str) -> str:
    """The answer text of a ``{"content": "..."}`` reply still being written (what can be
    shown while streaming); ``""`` for a tool-call reply or before the string starts."""
    head = text.lstrip()
    if not head.startswith("{"):
        return ""
    rest = head[1:].lstrip()
    if not rest.startswith('"content"'):
        return ""
    rest = rest[len('"content"'):].lstrip()
    if not rest.startswith(":"):
        return ""
    rest = rest[1:].lstrip()
    if not rest.startswith('"'):
        return ""
    body, escaped, end = rest[1:], False, None
    for i, ch in enumerate(body):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            end = i
            break
    body = body[:end] if end is not None else body
    while body:  # drop an escape sequence cut in the middle
        try:
            return json.loads(f'"{body}"')
        except json.JSONDecodeError:
            body = body[:-1]
    return ""


# ---- LlamaIndex conversation -> chat template -----------------------------------------
def template_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Earlier calls and their results in roles any chat template knows.

    An assistant turn with calls becomes the JSON reply that made them; a tool result
    becomes a user turn naming the tool. Adjacent user turns (several results) are joined,
    since some templates insist on alternating roles. Messages without either pass as-is.
    """
    names: dict[str, str] = {}
    out: list[ChatMessage] = []
    for m in messages:
        calls = tool_selections(m) if m.role == MessageRole.ASSISTANT else []
        if calls:
            names.update({c.tool_id: c.tool_name for c in calls if c.tool_id})
            out.append(ChatMessage(role=MessageRole.ASSISTANT, content=_reply_text(calls)))
        elif m.role in (MessageRole.TOOL, MessageRole.FUNCTION):
            call_id = str(m.additional_kwargs.get("tool_call_id") or "")
            name = m.additional_kwargs.get("name") or names.get(call_id) or "a tool"
            text = f"Result of {name}: {m.content or ''}"
            if out and out[-1].role == MessageRole.USER:
                out[-1] = ChatMessage(role=MessageRole.USER,
                                      content=f"{out[-1].content or ''}\n\n{text}")
            else:
                out.append(ChatMessage(role=MessageRole.USER, content=text))
        else:
            out.append(m)
    return out


def _reply_text(calls: Sequence[ToolSelection]) -> str:
    """The reply shape the model writes for these calls."""
    return json.dumps({"tool_calls": [{"name": c.tool_name, "arguments": c.tool_kwargs}
                                      for c in calls]})
