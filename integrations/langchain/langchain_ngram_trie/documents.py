"""Choosing the documents a call drafts from, and naming them in the response.

Precedence: documents passed to the call (``llm.bind(documents=...)`` or a ``documents=``
keyword) over documents retrieved in the enclosing chain, over none (the prompt itself is
then the draft source). Drafting only proposes tokens that the model verifies, so the choice
changes speed, never the answer.

Documents from a retriever come with the retriever's answer scope (see ``scopes``): the
call also drafts from that scope's earlier answers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.documents import Document

from .retrieved import Retrieved
from .scopes import retriever_scope

DocumentOrigin = Literal["argument", "retriever", "prompt"]
PREVIEW_CHARS = 80


def as_documents(items: Any) -> Any:
    """The documents as given, strings as ``Document`` s (so every one can be named);
    anything else, the collection included, goes to the core as it is, which settles
    kinds (bytes with a hint to decode them), blank documents and repeats, once
    (:func:`ngram_trie_rag.validation.check_documents`)."""
    if not isinstance(items, list | tuple):
        return items
    return [Document(page_content=item) if isinstance(item, str) else item for item in items]


def describe(doc: Any) -> dict[str, Any]:
    """A short, stable reference to a document: its id and metadata when it has them,
    always a content hash and a preview, never the full text (token ids, which the local
    engine takes too, are shown as their list)."""
    text = doc.page_content if isinstance(doc, Document) else str(list(doc))
    return {
        "id": getattr(doc, "id", None),
        "metadata": dict(getattr(doc, "metadata", {})),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()[:16],
        "preview": text[:PREVIEW_CHARS],
    }


@dataclass(frozen=True)
class DraftDocuments:
    """What one call drafts from; an empty ``documents`` means the prompt. They are the
    documents as passed or retrieved: the engine drops blank and repeated ones (its
    ``num_documents`` counts those drafted from)."""

    documents: Any = field(default_factory=list)  # Documents, or what the core refuses
    origin: DocumentOrigin = "prompt"
    retriever_scopes: tuple[str, ...] = ()  # answer scopes of the retrievers drafted from
    answer_scope: str | None = None  # the scope whose earlier answers are drafted from too

    @property
    def texts(self) -> Any:
        """The request's ``documents`` (``None`` = draft from the prompt)."""
        if not isinstance(self.documents, list):  # not a list: the core says what is wrong
            return self.documents
        return [d.page_content if isinstance(d, Document) else d
                for d in self.documents] or None

    def describe(self) -> list[dict[str, Any]]:
        return [describe(d) for d in self.documents]


def choose_documents(explicit: Any, retrieved: Retrieved | None) -> DraftDocuments:
    """Explicit documents, else the chain's ``retrieved`` ones, else the prompt.

    ``explicit`` is ``None`` when the caller passed none; an explicit empty list means
    "draft from the prompt" even inside a retrieval chain. ``retrieved`` is ``None`` when
    no retriever ran for the call (or the call does not use retrieved documents).
    """
    if explicit is not None:
        docs = as_documents(explicit)
        return DraftDocuments(docs, "argument" if _given(docs) else "prompt")
    if retrieved is not None:
        # A retriever ran for this call: it is in the retriever's scope even when nothing
        # came back.
        scopes = tuple(retriever_scope(name, meta) for name, meta in retrieved.retrievers)
        docs = list(retrieved.documents)
        return DraftDocuments(docs, "retriever" if docs else "prompt", scopes)
    return DraftDocuments()


def _given(docs: Any) -> bool:
    """Whether documents were given: anything but an empty list (a value the core
    refuses counts, so the call reaches the core and fails there)."""
    return not isinstance(docs, list) or bool(docs)
