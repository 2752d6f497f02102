"""LangChain's tool vocabulary <-> the core's tool-call format.

Tools arrive in any form LangChain accepts (``BaseTool``, Pydantic and TypedDict classes,
functions, OpenAI dicts) and leave as :class:`ToolSpec`; ``tool_choice`` arrives in
LangChain's, OpenAI's or Anthropic's spelling and leaves as the core's choice string; a
reply's parsed calls leave as the ``tool_calls`` / ``tool_call_chunks`` of an AI message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolCall, ToolCallChunk
from langchain_core.utils.function_calling import convert_to_openai_tool
from ngram_trie_rag.wrappers.tool_calls import ToolCall as CoreToolCall
from ngram_trie_rag.wrappers.tool_calls import ToolSpec


def tool_specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """Each tool's name, description and argument schema (a tool given twice, e.g. as a
    class and as its schema, is simply offered twice: the reply names it either way)."""
    specs = []
    for tool in tools:
        function = convert_to_openai_tool(tool)["function"]
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        specs.append(ToolSpec(function["name"], function.get("description", ""), parameters))
    return specs


def tool_choice_name(choice: Any, names: Sequence[str]) -> str:
    """``"auto"``, ``"required"``, ``"none"`` or a tool's name.

    ``None`` lets the model decide (LangChain's default); ``"any"``, ``"required"`` and
    ``True`` force a call; a dict names a tool (``{"type": "function", "function":
    {"name": ...}}``, ``{"type": "tool", "name": ...}``) or a mode (``{"type": "any"}``).
    """
    if choice is None or choice == "auto":
        return "auto"
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False or choice == "none":
        return "none"
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if name is None:
            return tool_choice_name(choice.get("type"), names)
        choice = name
    if isinstance(choice, str) and choice in names:
        return choice
    raise ValueError(f"tool_choice {choice!r} is neither 'auto', 'any', 'required', 'none' "
                     f"nor a bound tool's name; tools: {list(names)}")


def as_tool_calls(calls: Sequence[CoreToolCall]) -> list[ToolCall]:
    """The calls parsed from a reply under the tool-call grammar (a reply cut by the token
    limit has none) as an AI message's ``tool_calls``."""
    return [ToolCall(name=c.name, args=c.arguments, id=c.id, type="tool_call") for c in calls]


def tool_call_chunks(calls: Sequence[ToolCall]) -> list[ToolCallChunk]:
    """The calls as stream chunks (arguments as JSON text, as providers stream them)."""
    return [ToolCallChunk(name=c["name"], args=json.dumps(c["args"], ensure_ascii=False),
                          id=c["id"], index=i, type="tool_call_chunk")
            for i, c in enumerate(calls)]
