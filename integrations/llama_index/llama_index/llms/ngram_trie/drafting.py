"""What one LLM call drafts from: explicit documents, a ``drafting_from`` block, the
retrieved nodes of the running query, or (none of these) the prompt itself.

Node texts are taken the way the response synthesizer puts them into the prompt
(``get_content(metadata_mode=MetadataMode.LLM)``), so what the model copies from the context
is exactly what the trie holds. Retrieved nodes come with the answer scope of the retrievers
that found them (see ``scopes``): the call also drafts from that scope's earlier answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Literal

from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore
from ngram_trie_rag.inputs import unique_documents
from ngram_trie_rag.validation import refuse_bytes

from .tracking import get_tracker

DraftItem = str | BaseNode | NodeWithScore
DraftOrigin = Literal["documents", "retrieved_nodes", "prompt"]


@dataclass(frozen=True)
class DraftSource:
    """The texts one call drafts from; ``texts`` empty means "draft from the prompt"."""

    origin: DraftOrigin
    texts: tuple[str, ...] = ()
    node_ids: tuple[str | None, ...] = field(default=())
    retriever_scope: str | None = None  # answer scope of the retrievals that found them
    answer_scope: str | None = None  # the scope whose earlier answers are drafted from too

    @property
    def documents(self) -> list[str] | None:
        """What the backend takes: ``None`` drafts from the prompt."""
        return list(self.texts) if self.texts else None


def to_draft_source(items: Iterable[DraftItem], origin: DraftOrigin) -> DraftSource:
    """Texts (with node ids where known) of strings, nodes or scored nodes.

    Empty or whitespace texts (e.g. an image node) are skipped: there is nothing to draft
    from in them, and the core rejects them. Repeated texts are kept once (first
    occurrence), so the node ids reported name the texts the trie was built from. With no
    text left the prompt is the draft source. Bytes are refused with a hint to decode
    them; the texts themselves are checked where the backend encodes them.
    """
    refuse_bytes(items)
    if isinstance(items, str | BaseNode | NodeWithScore):
        items = [items]
    found: list[tuple[str, str | None]] = []
    for item in items:
        node = item.node if isinstance(item, NodeWithScore) else item
        if isinstance(node, BaseNode):
            text, node_id = node.get_content(metadata_mode=MetadataMode.LLM), node.node_id
        elif isinstance(node, str):
            text, node_id = node, None
        else:
            raise TypeError(
                f"draft documents must be strings or LlamaIndex nodes, got {type(item).__name__}"
            )
        if text.strip():
            found.append((text, node_id))
    if not found:  # nothing usable: the backend drafts from the prompt
        return DraftSource("prompt")
    texts, ids = zip(*unique_documents(found, key=lambda pair: pair[0]), strict=True)
    return DraftSource(origin, texts, ids)


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
