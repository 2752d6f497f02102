"""Running blocking generation off the event loop.

Generation is serialised on the generator's lock and a stream holds that lock from its first
chunk to its last. If streams were advanced chunk by chunk on the shared default executor,
requests waiting for the lock could fill every executor thread while the lock holder waits
for a thread to compute its next chunk: a deadlock. So each async call runs start to finish
on a worker of a dedicated pool; a waiting call then never blocks the one holding the lock,
and the default executor stays free for callbacks and retrievers.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="ngram-trie")
_DONE = object()


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the generation pool, with the caller's context variables."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_POOL, ctx.run, fn, *args)


async def iterate_blocking(open_iterator: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Items of a blocking iterator, produced on one pool worker from start to finish.

    The producer never waits for the consumer (the queue is unbounded), so the iterator
    always runs to its end or to the consumer's exit; leaving early stops it at its next
    item and closes it (for a generation stream: frees the lock and the KV cache).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, Any]] = asyncio.Queue()
    stop = threading.Event()

    def send(kind: Any, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone: nobody is listening any more
            stop.set()

    def produce() -> None:
        try:
            iterator = open_iterator()
            try:
                for item in iterator:
                    if stop.is_set():
                        break
                    send(None, item)
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        except BaseException as exc:  # re-raised in the consumer
            send(exc, None)
        else:
            send(_DONE, None)

    ctx = contextvars.copy_context()
    loop.run_in_executor(_POOL, ctx.run, produce)
    try:
        while True:
            kind, value = await queue.get()
            if kind is _DONE:
                return
            if kind is not None:
                raise kind
            yield value
    finally:
        stop.set()
