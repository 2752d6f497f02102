"""What a response reports: token usage, finish reason and how the speculation went.

``speculative`` holds the generator's per-request counters (steps, drafted nodes, accept
lengths and their mean, timings) plus the documents the trie was built from, named by id,
metadata, hash and a short preview, so a trace shows why a call was fast or slow.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages.ai import UsageMetadata
from ngram_trie_rag import GenerationResult

from .documents import DraftDocuments


def usage_metadata(result: GenerationResult) -> UsageMetadata:
    return UsageMetadata(input_tokens=result.prompt_tokens,
                         output_tokens=result.completion_tokens,
                         total_tokens=result.prompt_tokens + result.completion_tokens)


def speculative_stats(result: GenerationResult, draft: DraftDocuments) -> dict[str, Any]:
    """The generator's stats, plus which documents were drafted from and why those."""
    return {**result.stats.to_dict(), "documents_from": draft.origin,
            "documents": draft.describe()}


def response_metadata(model_name: str, result: GenerationResult,
                      draft: DraftDocuments) -> dict[str, Any]:
    return {"model_name": model_name, "finish_reason": result.finish_reason,
            "speculative": speculative_stats(result, draft)}
