"""The seam every engine sits behind: four calls, one request type, one answer type.

Implementations: :class:`~ngram_trie_rag.backends.local.LocalBackend` (this package's
engine) and :class:`~ngram_trie_rag.backends.vllm.VLLMBackend` (vLLM in this process, or
a running vLLM server). Framework wrappers hold one and never branch on which::

    backend = open_backend(BackendSettings(model=None))
    for delta in backend.stream(Request("Where was Socrates born?", ["Socrates was born
                                        in Alopece."], GenerationOptions(max_new_tokens=32))):
        print(delta.text, end="")
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol, runtime_checkable

from .types import Answer, Delta, Request


@runtime_checkable
class Backend(Protocol):
    name: str  # "local", "vllm" or "vllm-server": what answers report
    drafts_locally: bool  # True: method, num_draft, answer stores apply

    @property
    def model_name(self) -> str: ...

    @property
    def context_window(self) -> int | None: ...

    @property
    def tokenizer(self) -> Any: ...  # None where it cannot be seen (a remote server)

    def stream(self, request: Request) -> Iterator[Delta]:
        """Text deltas, then the last delta with the answer; closing early stops it."""
        ...

    async def astream(self, request: Request) -> AsyncIterator[Delta]:
        """Awaited once (bad input raises here); then the deltas, read with ``async for``."""
        ...

    def complete(self, request: Request) -> Answer: ...

    async def acomplete(self, request: Request) -> Answer: ...
