"""Where a call runs (this package's engine, a vLLM server, vLLM in this process) and the
finished answer every one of them reports in the same shape.

* default: the local speculative generator (tree drafts, exact per-step stats);
* ``base_url="http://host:port/v1"``: vLLM's OpenAI-compatible server started by
  ``ngram-trie-rag serve``; each request carries its documents in ``vllm_xargs``;
* ``backend="vllm"``: vLLM's ``AsyncLLM`` in this process, shared per model and engine
  arguments; concurrent async calls are batched by vLLM.

Settings only one place reads are refused elsewhere, at construction: a pinned
``num_draft`` that vLLM never sees would mislead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ngram_trie_rag import GenerationResult
from ngram_trie_rag.answer_scopes import SETTINGS as ANSWER_SETTINGS
from ngram_trie_rag.serving.openai_http import Delta
from ngram_trie_rag.serving.placement import (  # noqa: F401 - re-exported for the wrapper
    Place,
    foreign_fields,
    only_for,
    place,
    refuse_local_call_options,
    vllm_options,
)

# Fields each place alone reads (NGramTrieLLM field names; "generator" is the init argument).
ONLY_FOR = only_for(("generator", "device", "dtype", "n", "prefix_len", "num_draft", "method",
                     *ANSWER_SETTINGS))
LOCAL_CALL_OPTIONS = ("num_draft", "method")  # per-call keywords vLLM cannot honour


@dataclass(frozen=True)
class Outcome:
    """A finished answer, whichever engine produced it."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    speculative: dict[str, Any]  # the engine's counters (see ``NGramTrieLLM``)
    token_ids: list[int] | None = None  # the local engine's new tokens; vLLM sends none

    @classmethod
    def from_result(cls, result: GenerationResult) -> Outcome:
        return cls(result.text, result.finish_reason, result.prompt_tokens,
                   result.completion_tokens, result.stats.to_dict(), list(result.token_ids))

    @classmethod
    def from_vllm(cls, backend: str, text: str, last: Delta, num_documents: int) -> Outcome:
        """``last``: the stream's last delta. vLLM reports per-request acceptance only when
        its ``per_request_spec_decode_metrics`` option is on; else ``acceptance`` is None."""
        assert last.finish_reason is not None
        stats = {"backend": backend, "draft_source": "documents" if num_documents else "prompt",
                 "num_documents": num_documents, "acceptance": last.speculative}
        return cls(text, last.finish_reason, last.prompt_tokens or 0,
                   last.completion_tokens or 0, stats)


def check_fields(where: Place, fields_set: Iterable[str]) -> None:
    """Refuse fields that ``where`` does not read (``model_path`` names no served model)."""
    given = set(fields_set)
    foreign = foreign_fields(where, given, ONLY_FOR)
    if where == "vllm-server" and "model_path" in given:
        foreign.append("model_path (use model_name for the served model)")
    if foreign:
        raise ValueError(f"{', '.join(foreign)} cannot be used where calls run on {where!r}")


def check_call_options(where: Place, kwargs: Mapping[str, Any]) -> None:
    """Refuse per-call options that only the local engine honours."""
    refuse_local_call_options(where, [k for k in LOCAL_CALL_OPTIONS if kwargs.get(k) is not None])
