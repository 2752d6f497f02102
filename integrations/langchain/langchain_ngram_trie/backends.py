"""Where a model call runs: this package's engine, a vLLM server, or vLLM in this process.

* ``backend="local"`` (default): the local speculative generator (tree drafts, exact stats).
* ``base_url="http://host:port/v1"``: vLLM's OpenAI-compatible server started by
  ``ngram-trie-rag serve``; each request carries its documents in ``vllm_xargs``.
* ``backend="vllm"``: vLLM's ``AsyncLLM`` in this process, shared per model and engine
  arguments; concurrent calls are batched by vLLM.

Settings that only one place understands are refused elsewhere, at construction, rather
than silently ignored (a pinned ``num_draft`` that vLLM never sees would mislead).
"""

from __future__ import annotations

from collections.abc import Iterable

from ngram_trie_rag.answer_scopes import SETTINGS as ANSWER_SETTINGS
from ngram_trie_rag.serving.placement import (  # noqa: F401 - re-exported for the wrappers
    Place,
    foreign_fields,
    only_for,
    place,
    refuse_local_call_options,
    vllm_options,
)

# Fields each place alone reads (LangChain field names).
ONLY_FOR = only_for(("generator", "device", "dtype", "n", "prefix_len", "num_draft",
                     "draft_method", *ANSWER_SETTINGS))
LOCAL_CALL_OPTIONS = ("num_draft", "draft_method")  # per-call keywords vLLM cannot honour


def check_fields(where: Place, fields_set: Iterable[str]) -> None:
    """Refuse fields that ``where`` does not read."""
    foreign = foreign_fields(where, fields_set, ONLY_FOR)
    if foreign:
        raise ValueError(f"{', '.join(foreign)} cannot be used where calls run on {where!r} "
                         f"({describe(where)})")


def check_call_options(where: Place, kwargs: Iterable[str]) -> None:
    """Refuse per-call options that only the local engine honours."""
    refuse_local_call_options(where, set(kwargs) & set(LOCAL_CALL_OPTIONS))


def describe(where: Place) -> str:
    return {"local": "this package's engine",
            "vllm": "vLLM in this process",
            "vllm-server": "a vLLM server"}[where]
