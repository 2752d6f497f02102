"""Structured RAG tasks for ``bench --grammar``: a grammar and the instruction that asks
for it, appended to every prompt.

``cited-json``: ``{"answer": "...", "quote": "..."}``, the quote copied from the passages,
the task where copying pays most (field values quoted, the scaffolding forced). Any other
value is read as a JSON-schema file, with a generic JSON instruction.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..decoding.grammar import Grammar

CITED = {"type": "object",
         "properties": {"answer": {"type": "string"}, "quote": {"type": "string"}},
         "required": ["answer", "quote"], "additionalProperties": False}
PRESETS = {
    "cited-json": (CITED, "Answer as a JSON object with an \"answer\" and a \"quote\": one "
                          "sentence copied word for word from the passages."),
    "json": (None, "Answer as a JSON object."),
}


def bench_grammar(name: str) -> tuple[Grammar, str]:
    """A preset or a JSON-schema file -> (grammar, instruction for the prompt)."""
    if name in PRESETS:
        schema, instruction = PRESETS[name]
        return (Grammar.json() if schema is None else Grammar.json_schema(schema)), instruction
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"--grammar {name!r} is neither a preset ({', '.join(PRESETS)}) "
                         "nor a JSON-schema file")
    try:
        schema = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc
    return Grammar.json_schema(schema), "Answer as JSON matching this schema: " + json.dumps(
        schema)
