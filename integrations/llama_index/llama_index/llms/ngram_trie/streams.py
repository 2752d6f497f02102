"""A ``GenerationStream`` as (text delta, result) pairs, for sync and async callers.

The model's lock is held from a stream's first step until it is closed, so every path
that can stop reading early (``break``, cancellation, an abandoned generator) must close
the stream. In async code a single worker thread owns the stream from start to end: the
event loop only waits on a queue, and a consumer that goes away just raises a flag.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

from ngram_trie_rag import GenerationResult, GenerationStream


def deltas(stream: GenerationStream) -> Iterator[tuple[str, GenerationResult | None]]:
    """(text delta, result once finished); closing early releases the model's lock."""
    with stream:
        for delta in stream:
            yield delta, stream.result


_END = object()


async def adeltas(stream: GenerationStream) -> AsyncIterator[tuple[str, GenerationResult | None]]:
    """``deltas`` for the event loop: one worker thread runs the whole stream.

    Only that thread touches the stream, so a consumer that stops early or is cancelled
    cannot leave the model's lock held: it sets ``stop``, and the worker closes the stream
    after the step in flight.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def post(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def produce() -> None:
        try:
            with stream:
                for delta in stream:
                    if stop.is_set():
                        return
                    post((delta, stream.result))
        except BaseException as exc:  # handed to the consumer, raised there
            post(exc)
        else:
            post(_END)

    loop.run_in_executor(None, produce)  # the executor holds the future; produce never raises
    try:
        while True:
            item = await queue.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


async def acollect(stream: GenerationStream) -> GenerationResult:
    """Run the whole stream off the event loop; its final result."""
    result = None
    async for _, final in adeltas(stream):
        result = final
    assert result is not None
    return result
