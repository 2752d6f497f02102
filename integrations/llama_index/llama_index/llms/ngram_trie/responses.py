"""LlamaIndex responses from the core's answers.

A response holds the text so far (and the new ``delta`` while streaming); the response of
a finished answer also carries what callers read to judge the call, with the same keys
whichever engine ran it:

* ``additional_kwargs``: ``model_name``, ``finish_reason``, the token counts,
  ``speculative`` (the engine's counters and the ``answer_scope`` drafted from),
  ``draft_origin`` and ``draft_node_ids``;
* ``raw``: ``usage``, ``finish_reason``, ``token_ids`` (the local engine's new tokens; vLLM
  hands out none), ``speculative``, ``draft_origin``, ``draft_node_ids``, ``draft_texts``,
  and ``reply`` (the JSON as written) for a tool-call reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)
from ngram_trie_rag.backends import Answer

from .calls import Call
from .tools import reply_message, streamed_content

R = TypeVar("R", CompletionResponse, ChatResponse)
# (call, text so far, new text or None for a whole answer, the answer once finished)
Make = Callable[[Call, str, str | None, Answer | None], R]


def finished(call: Call, answer: Answer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(additional_kwargs, raw) of a finished call."""
    source = call.source
    stats = {**answer.speculative, "answer_scope": source.answer_scope}
    usage = {"prompt_tokens": answer.prompt_tokens,
             "completion_tokens": answer.completion_tokens,
             "total_tokens": answer.total_tokens}
    drafts = {"speculative": stats, "draft_origin": source.origin,
              "draft_node_ids": list(source.node_ids)}
    extra = {"model_name": call.model_name or answer.model_name,
             "finish_reason": answer.finish_reason, **usage, **drafts}
    token_ids = {"token_ids": answer.token_ids} if answer.token_ids is not None else {}
    raw = {"usage": usage, "finish_reason": answer.finish_reason, **token_ids, **drafts,
           "draft_texts": list(source.texts)}
    return extra, raw


def completion(call: Call, text: str, delta: str | None,
               answer: Answer | None) -> CompletionResponse:
    if answer is None:
        return CompletionResponse(text=text, delta=delta)
    extra, raw = finished(call, answer)
    return CompletionResponse(text=text, delta=delta, additional_kwargs=extra, raw=raw)


def chat(call: Call, text: str, delta: str | None, answer: Answer | None) -> ChatResponse:
    if call.request.tool_reply:
        return tool_chat(call, text, delta, answer)
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
    if answer is None:
        return ChatResponse(message=message, delta=delta)
    extra, raw = finished(call, answer)
    return ChatResponse(message=message, delta=delta, additional_kwargs=extra, raw=raw)


def tool_chat(call: Call, text: str, delta: str | None,
              answer: Answer | None) -> ChatResponse:
    """A tool-call reply: the message holds its content and calls, never the JSON (kept
    in ``raw["reply"]``). While streaming, ``delta`` is new answer text only, so an
    agent's stream shows the answer and not the JSON around it."""
    before = streamed_content(text[: len(text) - len(delta or "")])
    if answer is None:
        content = streamed_content(text)
        message = ChatMessage(role=MessageRole.ASSISTANT, content=content)
        return ChatResponse(message=message, delta=content[len(before):])
    parsed = None if answer.content is None else (answer.content, answer.tool_calls)
    message = reply_message(text, parsed)
    content = message.content or ""
    if delta is not None:  # the rest of the answer (none when the reply was calls)
        delta = content[len(before):] if content.startswith(before) else ""
    extra, raw = finished(call, answer)
    return ChatResponse(message=message, delta=delta, additional_kwargs=extra,
                        raw={**raw, "reply": text})
