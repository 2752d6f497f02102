"""A LlamaIndex call, fixed when it is made: the core's request and where its drafts came
from. Fixed then, not when a stream is first read: by that time the query's spans (which
name the retrieved nodes) have closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ngram_trie_rag.backends import Request
from ngram_trie_rag.wrappers.settings import OPTION_FIELDS

from .drafting import DraftSource

# Call keywords that are generation options (the core's names). Anything else LlamaIndex
# passes along (``formatted``, ``documents``...) is not an option and is left alone.
# ``grammar``: an ``ngram_trie_rag.decoding.grammar.Grammar`` the answer must match (vLLM gets it
# as its structured outputs).
OPTION_KEYWORDS = (*OPTION_FIELDS, "grammar")
TOKEN_BUDGET = "max_tokens"  # LlamaIndex's usual spelling of max_new_tokens


@dataclass(frozen=True)
class Call:
    """One call: the request the backend runs, the draft source its response reports
    (its answer scope included) and the model name to report instead of the engine's."""

    request: Request
    source: DraftSource
    model_name: str | None = None


def option_changes(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The options a call's keywords change. ``None`` means "the instance's value", as
    LlamaIndex code passes unset arguments along; ``max_new_tokens`` wins over
    ``max_tokens``."""
    changes = {}
    if kwargs.get(TOKEN_BUDGET) is not None:
        changes["max_new_tokens"] = kwargs[TOKEN_BUDGET]
    changes.update({k: kwargs[k] for k in OPTION_KEYWORDS if kwargs.get(k) is not None})
    return changes
