"""A :class:`~ngram_trie_rag.decoding.grammar.Grammar` as vLLM's structured-outputs request.

vLLM constrains decoding itself (``SamplingParams.structured_outputs``, or the OpenAI
server's ``structured_outputs`` body field): its scheduler masks the target model's
logits at every verified position, draft tokens included, so the trie proposer needs
nothing of its own and a draft the grammar rejects is simply not accepted. vLLM's
engines this package starts run it with :data:`ENGINE_CONFIG`: xgrammar, the library the
local engine uses (so a grammar that compiles here compiles there), writing JSON without
free whitespace, as the local engine does (vLLM reads that setting per engine, not per
request; left free, a small model pads objects with blank lines and indentation).

>>> from ngram_trie_rag.decoding.grammar import Grammar
>>> structured_outputs(Grammar.regex("[0-9]+"))
{'regex': '[0-9]+'}
>>> structured_outputs(Grammar.json())
{'json_object': True}
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..decoding.grammar import Grammar


ENGINE_CONFIG = {"backend": "xgrammar", "disable_any_whitespace": True}


def structured_outputs(grammar: Grammar) -> dict[str, Any]:
    """The fields of vLLM's ``StructuredOutputsParams`` that say what ``grammar`` says."""
    if grammar.kind == "json_schema":
        return {"json": json.loads(grammar.source)}
    if grammar.kind == "json":
        return {"json_object": True}
    if grammar.kind == "regex":
        return {"regex": grammar.source}
    return {"grammar": grammar.source}  # "ebnf": xgrammar's EBNF, vLLM's default backend
