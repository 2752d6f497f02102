"""Retrieved nodes carried into a streamed response's reads.

A streaming synthesizer may return a lazy generator that calls the LLM only when the caller
first reads it, after every span of the query has closed: the span tracker (``tracking``)
then has nothing left to find. So the tracker wraps such a response's ``response_gen``
with :func:`carry`, which makes the nodes, their answer scope and the query's instrument
tags visible (ContextVars set only while the wrapped generator runs) to each read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.schema import NodeWithScore


@dataclass(frozen=True)
class Retrieved:
    """The nodes a call drafts from, and the answer scope of the retrievals above it."""

    nodes: list[NodeWithScore]
    scope: str | None = None


# What the streamed response being read drafts from (set only while it is read).
STREAMED: ContextVar[Retrieved | None] = ContextVar("ngram_trie_streamed_nodes", default=None)


def carry(gen: Any, carried: Retrieved, tags: dict[str, Any]) -> Any:
    """``gen`` (sync or async) with ``carried`` and the query's instrument ``tags`` visible
    while it runs; anything else is returned as is."""
    if hasattr(gen, "__anext__"):
        return _carry_async(gen, carried, tags)
    if hasattr(gen, "__next__"):
        return _carry_sync(gen, carried, tags)
    return gen


@contextmanager
def _visible(carried: Retrieved, tags: dict[str, Any]) -> Iterator[None]:
    """Inside: ``carried`` and the query's instrument tags are this context's, as they were
    while the query ran (an answer scope named in the tags included)."""
    token = STREAMED.set(carried)
    try:
        with instrument_tags(tags) if tags else nullcontext():
            yield
    finally:
        STREAMED.reset(token)


def _carry_sync(gen: Iterator[Any], carried: Retrieved,
                tags: dict[str, Any]) -> Iterator[Any]:
    """Yield from ``gen`` with ``carried`` visible to the LLM while ``gen`` runs."""
    try:
        while True:
            with _visible(carried, tags):
                try:
                    item = next(gen)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()  # stops the LLM stream (and frees its lock) when the reader stops early


async def _carry_async(gen: AsyncIterator[Any], carried: Retrieved,
                       tags: dict[str, Any]) -> AsyncIterator[Any]:
    """The async twin of ``_carry_sync``."""
    try:
        while True:
            with _visible(carried, tags):
                try:
                    item = await gen.__anext__()
                except StopAsyncIteration:
                    return
            yield item
    finally:
        aclose = getattr(gen, "aclose", None)
        if aclose is not None:
            await aclose()
