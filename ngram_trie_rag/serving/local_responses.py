"""The local server's response bodies, in the shapes vLLM's OpenAI server uses.

:mod:`.openai_http` parses them back (its tests pin that parser to vLLM's shapes):

- finish reasons as vLLM reports them: ``"stop"`` for both the end-of-sequence token and a
  stop string, told apart by ``stop_reason`` (the stop string, else null), ``"length"``;
- ``usage``: prompt, completion and total tokens (the completion counts an end-of-sequence
  token, as vLLM's does);
- ``metrics.speculative_decoding``: the request's acceptance under the names of vLLM's
  per-request summary (``mean_acceptance_length``, ``num_spec_steps``,
  ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``draft_acceptance_rate``), plus the
  local engine's own (``draft_source``, ``num_documents``, ``method``, ``engine``), so a
  client sees where the drafts came from.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..decoding.result import GenerationResult

OWNER = "ngram-trie-rag"


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def model_card(name: str, context_window: int | None) -> dict[str, Any]:
    """One ``/v1/models`` entry; ``max_model_len`` is what the client reads as the
    context window."""
    card: dict[str, Any] = {"id": name, "object": "model", "created": int(time.time()),
                            "owned_by": OWNER}
    if context_window:
        card["max_model_len"] = int(context_window)
    return card


def finish_fields(result: GenerationResult, stops: tuple[str, ...],
                  decode: Any = None) -> dict[str, Any]:
    """``finish_reason`` and ``stop_reason`` of a finished request, as vLLM writes them.

    A stop string is named by ``stop_reason``: the first of ``stops`` in the decoded ids
    (the stream keeps the token that completed it), else the first stop given."""
    if result.finish_reason == "eos":
        return {"finish_reason": "stop", "stop_reason": None}
    if result.finish_reason == "stop":
        return {"finish_reason": "stop", "stop_reason": matched_stop(result, stops, decode)}
    return {"finish_reason": result.finish_reason, "stop_reason": None}


def matched_stop(result: GenerationResult, stops: tuple[str, ...], decode: Any) -> str:
    if decode is not None and len(stops) > 1:
        text = decode(result.token_ids)
        found = [(text.find(s), i) for i, s in enumerate(stops) if s in text]
        if found:
            return stops[min(found)[1]]
    return stops[0] if stops else ""


def usage(result: GenerationResult) -> dict[str, int]:
    completion = result.completion_tokens
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion}


def speculative(result: GenerationResult) -> dict[str, Any]:
    """The request's acceptance (see the module docstring). An accept length counts the
    accepted draft tokens and the step's own token, so a step accepts ``length - 1``."""
    stats = result.stats
    steps = stats.steps
    accepted = sum(stats.accept_lengths) - steps
    drafted = stats.drafted
    return {"mean_acceptance_length": stats.mean_accept_length, "num_spec_steps": steps,
            "num_draft_tokens": drafted, "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "draft_source": stats.draft_source, "num_documents": stats.num_documents,
            "method": stats.method, "engine": stats.engine}


def metrics(result: GenerationResult) -> dict[str, Any]:
    return {"speculative_decoding": speculative(result)}


def whole(request_id: str, model: str, chat: bool, text: str, result: GenerationResult,
          finish: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed response."""
    choice: dict[str, Any] = {"index": 0, "logprobs": None, **finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(result), "metrics": metrics(result)}


def chunk(request_id: str, model: str, chat: bool, text: str | None = None,
          finish: dict[str, Any] | None = None, *, role: bool = False,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed event: a text delta (``role``: the assistant's opening one), the
    closing one with ``finish``, or (``text`` None, no finish, ``extra``) a usage event
    with no choices."""
    choices: list[dict[str, Any]] = []
    if text is not None or finish is not None:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None,
                                  **(finish or {})}
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text:
                delta["content"] = text
            elif role:
                delta["content"] = ""
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choices.append(choice)
    return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, **(extra or {})}


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    """OpenAI's error shape (what :func:`.openai_http.error_message` reads)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
