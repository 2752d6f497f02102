"""A ``GenerationStream`` as (text delta, result) pairs, for sync and async callers.

The model's lock is held from a stream's first step until it is closed, so every path
that can stop reading early (``break``, cancellation, an abandoned generator) must close
the stream. Async callers go through ``ngram_trie_rag.threads``: one worker of its
dedicated pool runs the whole stream, the event loop only waits, and a consumer that goes
away makes the worker close the stream after the step in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from ngram_trie_rag import GenerationResult, GenerationStream
from ngram_trie_rag.threads import iterate_blocking

Delta = tuple[str, GenerationResult | None]


def deltas(stream: GenerationStream) -> Iterator[Delta]:
    """(text delta, result once finished); closing early releases the model's lock."""
    with stream:
        for delta in stream:
            yield delta, stream.result


def adeltas(stream: GenerationStream) -> AsyncIterator[Delta]:
    """``deltas`` for the event loop, produced on the generation pool."""
    return iterate_blocking(lambda: deltas(stream))


def collect(stream: GenerationStream) -> GenerationResult:
    """Run the whole stream; its final result."""
    for _ in deltas(stream):
        pass
    assert stream.result is not None
    return stream.result


async def acollect(stream: GenerationStream) -> GenerationResult:
    """Run the whole stream off the event loop; its final result."""
    async for _ in adeltas(stream):
        pass
    assert stream.result is not None
    return stream.result
