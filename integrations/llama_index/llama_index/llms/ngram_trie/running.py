"""The four ways a call runs (whole or streamed, sync or async), each one path over the
backend seam: which engine answers is the backend's business.

Streams are opened when the call is made, so bad input raises there and not on the first
read; leaving a stream early closes the backend's, which stops generation (locally: frees
the model's lock and KV cache; on vLLM: aborts the request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, closing

from ngram_trie_rag.backends import Backend, Delta

from .calls import Call
from .responses import Make, R


def whole(engine: Backend, call: Call, make: Make[R]) -> R:
    answer = engine.complete(call.request)
    return make(call, answer.text, None, answer)


async def awhole(engine: Backend, call: Call, make: Make[R]) -> R:
    """Awaited; the event loop stays free while the engine works."""
    answer = await engine.acomplete(call.request)
    return make(call, answer.text, None, answer)


def streamed(engine: Backend, call: Call, make: Make[R]) -> Iterator[R]:
    """A response per delta, each holding the text so far; the last one is finished."""
    return _responses(engine.stream(call.request), call, make)


async def astreamed(engine: Backend, call: Call, make: Make[R]) -> AsyncIterator[R]:
    """Awaited (bad input raises here), then read with ``async for``."""
    return _aresponses(await engine.astream(call.request), call, make)


def _responses(deltas: Iterator[Delta], call: Call, make: Make[R]) -> Iterator[R]:
    text = ""
    with closing(deltas):  # type: ignore[type-var]
        for delta in deltas:
            text += delta.text
            yield make(call, text, delta.text, delta.answer)


async def _aresponses(deltas: AsyncIterator[Delta], call: Call,
                      make: Make[R]) -> AsyncIterator[R]:
    text = ""
    async with aclosing(deltas):  # type: ignore[type-var]
        async for delta in deltas:
            text += delta.text
            yield make(call, text, delta.text, delta.answer)
