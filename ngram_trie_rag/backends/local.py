"""The local engine as a backend: this package's speculative generator, in this process.

Tree drafts, exact per-step stats, answer stores, grammars. Calls on one model queue on
its lock; async calls run start to finish on a worker of the generation pool
(:mod:`ngram_trie_rag.wrappers.threads`), so the event loop only waits.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from typing import Any

from ..decoding.stream import GenerationStream
from ..generator import SpeculativeGenerator
from ..wrappers.threads import iterate_blocking, run_blocking
from .types import Answer, Delta, Request


class LocalBackend:
    """A :class:`SpeculativeGenerator` behind the backend seam.

    ``generator``: the generator, or a function that loads it on first use (loading takes
    seconds; a wrapper that is built and never called loads nothing).
    """

    name = "local"
    drafts_locally = True  # honours method, num_draft, repetition_stop, answer_store

    def __init__(self, generator: SpeculativeGenerator | Callable[[], SpeculativeGenerator]
                 ) -> None:
        loaded = isinstance(generator, SpeculativeGenerator)
        self._generator = generator if loaded else None
        self._load = None if loaded else generator
        self._lock = threading.Lock()

    @property
    def generator(self) -> SpeculativeGenerator:
        """The generator, loaded on first access."""
        if self._generator is None:
            with self._lock:
                if self._generator is None:
                    assert self._load is not None
                    self._generator = self._load()
        return self._generator

    @property
    def loaded(self) -> bool:
        return self._generator is not None

    @property
    def model_name(self) -> str:
        return self.generator.model_name

    @property
    def context_window(self) -> int:
        return self.generator.context_window

    @property
    def tokenizer(self) -> Any:
        return self.generator.tokenizer

    # ---- calls ------------------------------------------------------------------------
    def _open(self, request: Request) -> GenerationStream:
        """The request's stream, opened now: prompt and documents are encoded and checked
        here, so bad input fails at the call, not on the first read."""
        return self.generator.stream(request.prompt, request.documents, request.options)

    def _deltas(self, stream: GenerationStream, request: Request) -> Iterator[Delta]:
        with stream:  # leaving early frees the model's lock and the KV cache
            for text in stream:
                if text:
                    yield Delta(text)
        assert stream.result is not None
        yield Delta("", self._answer(stream, request))

    def _answer(self, stream: GenerationStream, request: Request) -> Answer:
        result = stream.result
        assert result is not None
        answer = Answer(result.text, result.finish_reason, result.prompt_tokens,
                        result.completion_tokens, self.generator.model_name, self.name,
                        result.stats.to_dict(), list(result.token_ids))
        return answer.parsed() if request.tool_reply else answer

    def stream(self, request: Request) -> Iterator[Delta]:
        """Text deltas as they are verified, then the last delta with the answer."""
        return self._deltas(self._open(request), request)

    async def astream(self, request: Request) -> AsyncIterator[Delta]:
        """Awaited: the request is opened (bad input raises here), then its deltas come
        from one pool worker; leaving early stops generation after the step in flight."""
        stream = await run_blocking(self._open, request)
        return iterate_blocking(lambda: self._deltas(stream, request))

    def complete(self, request: Request) -> Answer:
        return last_answer(self.stream(request))

    async def acomplete(self, request: Request) -> Answer:
        """Read from :meth:`astream`, so a cancelled call stops generation after the step
        in flight (a whole call run on a worker would finish and hold the model meanwhile)."""
        deltas = await self.astream(request)
        async with aclosing(deltas):  # type: ignore[type-var]
            async for delta in deltas:
                if delta.answer is not None:
                    return delta.answer
        raise RuntimeError("the stream ended before the answer finished")


def last_answer(deltas: Iterator[Delta]) -> Answer:
    """The answer a stream of deltas ends with."""
    for delta in deltas:
        if delta.answer is not None:
            return delta.answer
    raise RuntimeError("the stream ended before the answer finished")
