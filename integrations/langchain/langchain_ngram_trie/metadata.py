"""What a response reports: token usage, finish reason and how the speculation went.

``speculative`` holds the generator's per-request counters (steps, drafted nodes, accept
lengths and their mean, timings) plus the documents the trie was built from, named by id,
metadata, hash and a short preview, so a trace shows why a call was fast or slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages.ai import UsageMetadata
from ngram_trie_rag import GenerationResult

from .documents import DraftDocuments


@dataclass(frozen=True)
class Answer:
    """A finished generation, with what its response reports beside the text."""

    model_name: str
    result: GenerationResult
    draft: DraftDocuments


def usage_metadata(answer: Answer) -> UsageMetadata:
    result = answer.result
    return UsageMetadata(input_tokens=result.prompt_tokens,
                         output_tokens=result.completion_tokens,
                         total_tokens=result.prompt_tokens + result.completion_tokens)


def speculative_stats(answer: Answer) -> dict[str, Any]:
    """The generator's stats, plus which documents were drafted from and why those."""
    return {**answer.result.stats.to_dict(), "documents_from": answer.draft.origin,
            "documents": answer.draft.describe()}


def message_metadata(answer: Answer) -> dict[str, Any]:
    """``usage_metadata`` and ``response_metadata`` of a chat message or its last chunk."""
    return {
        "usage_metadata": usage_metadata(answer),
        "response_metadata": {"model_name": answer.model_name,
                              "finish_reason": answer.result.finish_reason,
                              "speculative": speculative_stats(answer)},
    }


def generation_info(answer: Answer) -> dict[str, Any]:
    """A completion's ``generation_info``."""
    return {"finish_reason": answer.result.finish_reason,
            "usage": dict(usage_metadata(answer)),
            "speculative": speculative_stats(answer)}
