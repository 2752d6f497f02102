"""What a response reports: token usage, finish reason and how the speculation went.

``speculative`` holds the engine's per-request counters plus the documents the trie was
built from, named by id, metadata, hash and a short preview, so a trace shows why a call was
fast or slow. The local engine counts steps, drafted nodes and accept lengths. vLLM
(server or in-process) reports per-request acceptance only when its
``per_request_spec_decode_metrics`` option is on (the in-process engine turns it on; a
server needs ``--per-request-spec-decode-metrics summary``); otherwise ``acceptance`` is
``None`` rather than a made-up number, and the server's ``/metrics`` has the aggregate
``vllm:spec_decode_*`` counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages.ai import UsageMetadata
from ngram_trie_rag import GenerationResult
from ngram_trie_rag.serving.openai_http import Delta

from .documents import DraftDocuments


@dataclass(frozen=True)
class Answer:
    """A finished generation, with what its response reports beside the text."""

    model_name: str
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: dict[str, Any]  # the engine's speculative counters
    draft: DraftDocuments

    @classmethod
    def from_result(cls, model_name: str, result: GenerationResult,
                    draft: DraftDocuments) -> Answer:
        """An answer of the local engine."""
        return cls(model_name, result.text, result.finish_reason, result.prompt_tokens,
                   result.completion_tokens, result.stats.to_dict(), draft)

    @classmethod
    def from_vllm(cls, backend: str, model_name: str, text: str, last: Delta,
                  draft: DraftDocuments) -> Answer:
        """An answer of vLLM (``backend``: "vllm-server" or "vllm"); ``last`` is the
        stream's last delta."""
        assert last.finish_reason is not None
        stats = {"backend": backend,
                 "draft_source": "documents" if draft.documents else "prompt",
                 "num_documents": len(draft.documents),
                 "acceptance": last.speculative}
        return cls(model_name, text, last.finish_reason, last.prompt_tokens or 0,
                   last.completion_tokens or 0, stats, draft)


def usage_metadata(answer: Answer) -> UsageMetadata:
    return UsageMetadata(input_tokens=answer.prompt_tokens,
                         output_tokens=answer.completion_tokens,
                         total_tokens=answer.prompt_tokens + answer.completion_tokens)


def speculative_stats(answer: Answer) -> dict[str, Any]:
    """The engine's stats (``store_answers``: earlier answers drafted from), plus which
    documents were drafted from and why those, and the answer scope (``None``: none)."""
    return {**answer.stats, "documents_from": answer.draft.origin,
            "documents": answer.draft.describe(), "answer_scope": answer.draft.answer_scope}


def message_metadata(answer: Answer) -> dict[str, Any]:
    """``usage_metadata`` and ``response_metadata`` of a chat message or its last chunk."""
    return {
        "usage_metadata": usage_metadata(answer),
        "response_metadata": {"model_name": answer.model_name,
                              "finish_reason": answer.finish_reason,
                              "speculative": speculative_stats(answer)},
    }


def generation_info(answer: Answer) -> dict[str, Any]:
    """A completion's ``generation_info``."""
    return {"finish_reason": answer.finish_reason,
            "usage": dict(usage_metadata(answer)),
            "speculative": speculative_stats(answer)}
