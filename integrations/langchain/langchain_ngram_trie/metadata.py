"""What a response reports: token usage, finish reason and how the speculation went.

``speculative`` holds the engine's per-request counters (the core
:class:`~ngram_trie_rag.backends.Answer`'s ``speculative``) plus the documents the call
was given, named by id, metadata, hash and a short preview, so a trace shows why a call was
fast or slow (the engine drops blank and repeated documents: its ``num_documents`` counts
those drafted from). The local engine counts steps, drafted nodes and accept lengths. vLLM
(server or in-process) reports per-request acceptance only when its
``per_request_spec_decode_metrics`` option is on (the in-process engine turns it on; a
server needs ``--per-request-spec-decode-metrics summary``); otherwise ``acceptance`` is
``None`` rather than a made-up number, and the server's ``/metrics`` has the aggregate
``vllm:spec_decode_*`` counters.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages.ai import UsageMetadata
from ngram_trie_rag.backends import Answer

from .documents import DraftDocuments


def usage_metadata(answer: Answer) -> UsageMetadata:
    return UsageMetadata(input_tokens=answer.prompt_tokens,
                         output_tokens=answer.completion_tokens,
                         total_tokens=answer.total_tokens)


def speculative_stats(answer: Answer, draft: DraftDocuments) -> dict[str, Any]:
    """The engine's stats (``store_answers``: earlier answers drafted from), plus which
    documents were drafted from and why those, and the answer scope (``None``: none)."""
    return {**answer.speculative, "documents_from": draft.origin,
            "documents": draft.describe(), "answer_scope": draft.answer_scope}


def message_metadata(answer: Answer, draft: DraftDocuments) -> dict[str, Any]:
    """``usage_metadata`` and ``response_metadata`` of a chat message or its last chunk."""
    return {
        "usage_metadata": usage_metadata(answer),
        "response_metadata": {"model_name": answer.model_name,
                              "finish_reason": answer.finish_reason,
                              "speculative": speculative_stats(answer, draft)},
    }


def generation_info(answer: Answer, draft: DraftDocuments) -> dict[str, Any]:
    """A completion's ``generation_info``."""
    return {"finish_reason": answer.finish_reason,
            "usage": dict(usage_metadata(answer)),
            "speculative": speculative_stats(answer, draft)}
