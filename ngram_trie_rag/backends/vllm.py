"""vLLM as a backend: its engine in this process, or a running OpenAI-compatible server.

Both clients (:class:`~ngram_trie_rag.serving.vllm_local.InProcessVLLM` and
:class:`~ngram_trie_rag.serving.openai_http.OpenAIHTTPBackend`) take a prompt, the documents
(sent along, where the trie proposer in vLLM drafts from them) and sampling options, and
yield their own deltas; this adapter turns them into the core's :class:`Delta` and
:class:`Answer`. vLLM drafts with its own proposer settings: the options only a local
drafter reads (``method``, ``num_draft``, ``repetition_stop``, ``answer_store``) are
refused, never dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, closing
from dataclasses import replace
from typing import Any

from ..decoding.options import LOCAL_ONLY
from ..validation import check_documents
from .types import Answer, Delta, Request


class VLLMBackend:
    """One vLLM client behind the backend seam; concurrent calls reach vLLM at once and
    vLLM batches them. ``client.name`` is ``"vllm"`` or ``"vllm-server"``."""

    drafts_locally = False

    def __init__(self, client: Any) -> None:
        self.client = client
        self.name: str = client.name

    @property
    def model_name(self) -> str:
        return self.client.model_name

    @property
    def context_window(self) -> int | None:
        return self.client.context_window

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer in this process; ``None`` for a server (its chat
        template cannot be seen from here)."""
        return getattr(self.client, "tokenizer", None)

    # ---- calls ------------------------------------------------------------------------
    def _settled(self, request: Request) -> Request:
        """The request with its documents settled (blanks and repeats dropped, kinds
        checked: :func:`~ngram_trie_rag.validation.check_documents`), so the answer counts
        what vLLM drafts from; options only a local drafter reads are refused."""
        options = request.options
        set_ = sorted(name for name in LOCAL_ONLY if getattr(options, name) is not None)
        if set_:
            raise ValueError(f"{', '.join(set_)} apply to the local engine only; vLLM "
                             "drafts with its own proposer settings")
        documents = check_documents(request.documents)
        if documents is not None and not all(isinstance(d, str) for d in documents):
            raise TypeError("documents must be texts on vLLM (it tokenises them itself)")
        return replace(request, documents=documents)

    @staticmethod
    def _arguments(request: Request) -> tuple[Any, list[str] | None, Any]:
        """(prompt, documents, options) of a settled request, as the vLLM clients take
        them."""
        documents = request.documents
        return request.prompt, list(documents) if documents else None, request.options

    @property
    def served_by(self) -> str:
        """The backend answers report: the client's account of what served them (a server
        may be vLLM's or ``ngram-trie-rag serve``'s own), else its kind."""
        return getattr(self.client, "served_by", self.name)

    def _answer(self, text: str, last: Any, request: Request) -> Answer:
        documents = len(request.documents or ())
        served_by = self.served_by
        stats = {"backend": served_by, "draft_source": "documents" if documents else "prompt",
                 "num_documents": documents, "acceptance": last.speculative}
        answer = Answer(text, last.finish_reason, last.prompt_tokens or 0,
                        last.completion_tokens or 0, self.model_name, served_by, stats)
        return answer.parsed() if request.tool_reply else answer

    def _deltas(self, parts: Iterator[Any], request: Request) -> Iterator[Delta]:
        text: list[str] = []
        with closing(parts):  # leaving early aborts the request
            for part in parts:
                if part.text:
                    text.append(part.text)
                    yield Delta(part.text)
                if part.finish_reason is not None:
                    yield Delta("", self._answer("".join(text), part, request))

    async def _adeltas(self, parts: AsyncIterator[Any], request: Request
                       ) -> AsyncIterator[Delta]:
        text: list[str] = []
        async with aclosing(parts):  # leaving early aborts the request
            async for part in parts:
                if part.text:
                    text.append(part.text)
                    yield Delta(part.text)
                if part.finish_reason is not None:
                    yield Delta("", self._answer("".join(text), part, request))

    def stream(self, request: Request) -> Iterator[Delta]:
        """Text deltas as vLLM sends them, then the last delta with the answer."""
        request = self._settled(request)
        return self._deltas(self.client.stream(*self._arguments(request)), request)

    async def astream(self, request: Request) -> AsyncIterator[Delta]:
        """Awaited: the request is checked (bad options raise here), then its deltas."""
        request = self._settled(request)
        return self._adeltas(self.client.astream(*self._arguments(request)), request)

    def complete(self, request: Request) -> Answer:
        request = self._settled(request)
        last = self.client.complete(*self._arguments(request))
        return self._answer(last.text, last, request)

    async def acomplete(self, request: Request) -> Answer:
        request = self._settled(request)
        last = await self.client.acomplete(*self._arguments(request))
        return self._answer(last.text, last, request)
