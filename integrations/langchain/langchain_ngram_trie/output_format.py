"""What shape an answer must take: bound tools, a JSON schema, or any JSON object.

A call's keywords (``tools``/``tool_choice``/``parallel_tool_calls`` from ``bind_tools``,
``response_format`` as OpenAI spells it) become one :class:`OutputFormat`: the grammar the
local engine decodes under, and an instruction for the system message. The grammar makes
the reply valid; the instruction is there because the model cannot see the grammar, and a
small model that did not expect to write JSON drifts inside the strings it is forced into.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ngram_trie_rag.decoding.grammar import Grammar
from ngram_trie_rag.wrappers.tool_calls import ToolSpec, tool_call_grammar, tools_system_prompt

from .tools import tool_choice_name, tool_specs

# The keywords a call may carry that describe the answer's shape.
FORMAT_KWARGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
# OpenAI's "json_object" promises an object, not any JSON value.
JSON_OBJECT_SCHEMA = {"type": "object"}


@dataclass(frozen=True)
class OutputFormat:
    """The constraint on one call's answer."""

    grammar: Grammar | None
    instruction: str | None  # added to the system message; None adds nothing
    tools: tuple[ToolSpec, ...] = ()  # non-empty: the reply is parsed into tool calls


def pop_output_format(kwargs: dict[str, Any]) -> OutputFormat | None:
    """Removes the format keywords from ``kwargs``; ``None`` when the answer is free text."""
    given = {name: kwargs.pop(name) for name in FORMAT_KWARGS if name in kwargs}
    tools = given.get("tools")
    response_format = given.get("response_format")
    if tools and response_format is not None:
        raise ValueError("tools and response_format exclude each other in one call")
    if tools:
        return _tools_format(tools, given.get("tool_choice"),
                             bool(given.get("parallel_tool_calls", False)))
    if response_format is not None:
        return _response_format(response_format)
    return None


def _tools_format(tools: Sequence[Any], tool_choice: Any, parallel: bool) -> OutputFormat:
    specs = tool_specs(tools)
    choice = tool_choice_name(tool_choice, [s.name for s in specs])
    if choice == "none":  # the tools stay unknown to the model: it answers in text
        return OutputFormat(None, None)
    return OutputFormat(tool_call_grammar(specs, choice, parallel),
                        tools_system_prompt(specs, choice), tuple(specs))


def _response_format(response_format: Any) -> OutputFormat | None:
    """OpenAI's ``response_format``: ``{"type": "text" | "json_object" | "json_schema"}``."""
    if not isinstance(response_format, Mapping):
        raise TypeError("response_format must be a dict such as {'type': 'json_object'}, "
                        f"got {type(response_format).__name__}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputFormat(Grammar.json_schema(JSON_OBJECT_SCHEMA),
                            "Reply with a JSON object.")
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ValueError("response_format of type 'json_schema' needs "
                             "{'json_schema': {'name': ..., 'schema': {...}}}")
        return OutputFormat(Grammar.json_schema(dict(schema)),
                            "Reply with a JSON object that matches this JSON schema: "
                            f"{json.dumps(schema)}")
    raise ValueError(f"unknown response_format type {kind!r}; "
                     "expected 'text', 'json_object' or 'json_schema'")
