"""What goes into a backend and what comes out, whichever engine runs the call.

A :class:`Request` is fixed when the call is made: the prompt, the documents to draft from
and the checked :class:`~ngram_trie_rag.decoding.options.GenerationOptions`. A backend answers with
:class:`Delta` s, text as it is verified, the last one carrying the finished
:class:`Answer`. Framework wrappers translate their own types to a request and from an
answer; nothing above this seam knows which engine ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..decoding.options import GenerationOptions
from ..inputs import DraftDocument, Prompt

if TYPE_CHECKING:
    from ..wrappers.tool_calls import ToolCall


@dataclass(frozen=True)
class Request:
    """One call: what to answer, what to draft from, and how to decode.

    ``documents`` ``None`` drafts from the prompt itself. They are passed as retrieved and
    settled once, by the backend that opens the request, under one policy
    (:func:`~ngram_trie_rag.validation.check_documents`): wrong kinds (bytes, numbers,
    mappings) are a ``TypeError``; blank documents, such as an empty chunk a retriever
    returned, are dropped, as are repeats; with none left the prompt is drafted from.
    ``tool_reply``: the answer is a reply under the tool-call grammar, parsed into content
    and calls when it finishes.
    """

    prompt: Prompt
    documents: Sequence[DraftDocument] | None = None
    options: GenerationOptions = field(default_factory=GenerationOptions)
    tool_reply: bool = False


@dataclass(frozen=True)
class Answer:
    """A finished answer, the same shape from every backend.

    ``speculative`` holds the engine's own counters: the local engine's per-step stats
    (accept lengths, draft sizes, timings, draft source); vLLM's per-request acceptance
    summary under ``acceptance`` when vLLM reports it, else ``None`` (never made up).
    ``token_ids``: the new tokens, where the engine hands them out (the local one).
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model_name: str
    backend: str  # "local", "vllm" (in this process) or "vllm-server"
    speculative: dict[str, Any]
    token_ids: list[int] | None = None
    content: str | None = None  # a tool reply's text part (else None)
    tool_calls: tuple[ToolCall, ...] = ()

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def parsed(self) -> Answer:
        """This answer with a tool reply's content and calls parsed from its text."""
        from ..wrappers.tool_calls import parse_reply  # with the grammar module, so torch: on use

        content, calls = parse_reply(self.text)
        return replace(self, content=content, tool_calls=tuple(calls))


@dataclass(frozen=True)
class Delta:
    """A piece of a streamed answer: non-empty ``text`` until the last delta, which
    carries the :class:`Answer` (its ``text`` may be empty)."""

    text: str
    answer: Answer | None = None

