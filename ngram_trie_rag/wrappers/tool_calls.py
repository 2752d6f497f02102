"""Tool calls for models without a tool-call format of their own: one JSON reply shape,
enforced by a grammar, described to the model in a system message.

The reply is a JSON object, either ``{"tool_calls": [{"name": ..., "arguments": {...}},
...]}`` or ``{"content": "..."}``. The grammar (:func:`tool_call_grammar`) admits only
calls of the offered tools, with arguments valid for each tool's JSON schema, so every
reply parses (:func:`parse_reply`). ``choice`` follows the OpenAI / LangChain values:

- ``"auto"``: a call or a plain answer, as the model decides;
- ``"required"`` (LangChain's ``"any"``): at least one call, of any tool;
- a tool's name: exactly that tool;
- ``"none"``: no grammar; the model answers in text.

Decoding under the grammar is exact and speculative like any constrained generation
(:mod:`ngram_trie_rag.decoding.grammar`): argument values copied from retrieved passages are
drafted from the trie, and the JSON scaffolding the grammar forces is drafted for free.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..decoding.grammar import Grammar


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: its name, what it does, its arguments' JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str


def _call_schema(tool: ToolSpec) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name},
                                             "arguments": dict(tool.parameters)},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_schema(tools: Sequence[ToolSpec], choice: str = "auto",
                     parallel: bool = False) -> dict | None:
    """The JSON schema of a reply, or None for ``"none"`` (free text). ``parallel``
    allows several calls in one reply (small models tend to repeat a call otherwise)."""
    if choice == "none":
        return None
    if not tools:
        raise ValueError("no tools to call")
    names = [t.name for t in tools]
    if choice in ("auto", "required", "any"):
        offered = list(tools)
    elif choice in names:
        offered = [t for t in tools if t.name == choice]
    else:
        raise ValueError(f"tool_choice {choice!r} names no offered tool; tools: {names}")
    one = _call_schema(offered[0]) if len(offered) == 1 else {
        "anyOf": [_call_schema(t) for t in offered]}
    array: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    calls = {"type": "object", "properties": {"tool_calls": array},
             "required": ["tool_calls"], "additionalProperties": False}
    if choice != "auto":
        return calls
    text = {"type": "object", "properties": {"content": {"type": "string"}},
            "required": ["content"], "additionalProperties": False}
    return {"anyOf": [calls, text]}


def tool_call_grammar(tools: Sequence[ToolSpec], choice: str = "auto",
                      parallel: bool = False) -> Grammar | None:
    schema = tool_call_schema(tools, choice, parallel)
    return None if schema is None else Grammar.json_schema(schema)


def tools_system_prompt(tools: Sequence[ToolSpec], choice: str = "auto") -> str:
    """What the model is told about the tools and the reply shape."""
    lines = ["You can call these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description or 'no description'} "
                     f"Arguments (JSON schema): {json.dumps(dict(t.parameters))}")
    lines.append('To call tools, reply with JSON: {"tool_calls": [{"name": "<tool>", '
                 '"arguments": {...}}]}.')
    if choice == "auto":
        lines.append('To answer without a tool, reply with JSON: {"content": "<answer>"}.')
    return "\n".join(lines)


def parse_reply(text: str) -> tuple[str, list[ToolCall]]:
    """A reply -> (content, tool calls). Text that is not such a JSON object (a reply
    cut by the token limit, or free text) is returned as content with no calls."""
    try:
        reply = json.loads(text)
    except json.JSONDecodeError:
        return text, []
    if not isinstance(reply, dict):
        return text, []
    calls = [ToolCall(str(c["name"]), dict(c.get("arguments") or {}),
                      f"call_{uuid.uuid4().hex[:24]}")
             for c in reply.get("tool_calls") or [] if isinstance(c, dict) and "name" in c]
    content = reply.get("content", "")
    return (content if isinstance(content, str) else json.dumps(content)), calls
