"""What one LLM call drafts from: explicit documents, a ``drafting_from`` block, the
retrieved nodes of the running query, or (none of these) the prompt itself.

Node texts are taken the way the response synthesizer puts them into the prompt
(``get_content(metadata_mode=MetadataMode.LLM)``), so what the model copies from the context
is exactly what the trie holds. Retrieved nodes come with the answer scope of the retrievers
that found them (see ``scopes``): the call also drafts from that scope's earlier answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from .tracking import get_tracker

DraftItem = str | BaseNode | NodeWithScore
DraftOrigin = Literal["documents", "retrieved_nodes", "prompt"]
# One document each, though some are iterable (a text, bytes, a node).
_SINGLE = (str, bytes, bytearray, memoryview, Mapping, BaseNode, NodeWithScore)


@dataclass(frozen=True)
class DraftSource:
    """The texts one call passes to the engine, as retrieved or given (the engine drops
    blank and repeated ones); ``texts`` empty means "draft from the prompt"."""

    origin: DraftOrigin
    texts: tuple[Any, ...] = ()  # strings, or items the core refuses by name
    node_ids: tuple[str | None, ...] = field(default=())
    retriever_scope: str | None = None  # answer scope of the retrievals that found them
    answer_scope: str | None = None  # the scope whose earlier answers are drafted from too

    @property
    def documents(self) -> list[Any] | None:
        """What the backend takes: ``None`` drafts from the prompt."""
        return list(self.texts) if self.texts else None


def to_draft_source(items: Iterable[DraftItem], origin: DraftOrigin) -> DraftSource:
    """Texts (with node ids where known) of strings, nodes or scored nodes, in order.

    Nothing is filtered here: the core settles blank texts (e.g. an image node's), repeats
    and wrong kinds once, for every caller (:func:`ngram_trie_rag.validation.check_documents`),
    so an item that is neither a string nor a node goes on as it is, for the core to refuse
    by name (bytes with a hint to decode them). A single item counts as one document. With
    no item the prompt is the draft source.
    """
    if isinstance(items, _SINGLE) or not isinstance(items, Iterable):
        items = [items]
    found = [_text_and_id(item) for item in items]
    if not found:
        return DraftSource("prompt")
    texts, ids = zip(*found, strict=True)
    return DraftSource(origin, texts, ids)


def _text_and_id(item: Any) -> tuple[Any, str | None]:
    """A node's text as the response synthesizer puts it into the prompt, and its id;
    anything else as it is, with no id."""
    node = item.node if isinstance(item, NodeWithScore) else item
    if isinstance(node, BaseNode):
        return node.get_content(metadata_mode=MetadataMode.LLM), node.node_id
    return item, None


_OVERRIDE: ContextVar[DraftSource | None] = ContextVar("ngram_trie_draft_override", default=None)


@contextmanager
def drafting_from(documents: Iterable[DraftItem]) -> Iterator[DraftSource]:
    """Draft every ``NGramTrieLLM`` call inside the block from ``documents``.

    For code that already holds the nodes or texts its prompt was built from. It is a
    ContextVar, so it follows the code into ``asyncio`` tasks and ``asyncio.to_thread`` and
    never leaks into concurrent requests.
    """
    source = to_draft_source(documents, "documents")
    token = _OVERRIDE.set(source)
    try:
        yield source
    finally:
        _OVERRIDE.reset(token)


def resolve_draft_source(documents: Iterable[DraftItem] | None = None) -> DraftSource:
    """Pick the draft source for a call starting now, in this task or thread.

    Order: ``documents`` passed to the call, then an enclosing ``drafting_from`` block, then
    the nodes of the running query (see ``tracking``), else the prompt. Call it when the
    request is made, not when a stream is first read: by then the query's spans are closed.
    """
    if documents is not None:
        return to_draft_source(documents, "documents")
    override = _OVERRIDE.get()
    if override is not None:
        return override
    found = get_tracker().current()
    if found is not None:  # a retriever ran for this call: it is in that retriever's scope
        source = to_draft_source(found.nodes, "retrieved_nodes")
        return replace(source, retriever_scope=found.scope)
    return DraftSource("prompt")
