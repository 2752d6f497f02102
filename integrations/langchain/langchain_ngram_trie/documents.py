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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.documents import Document
from ngram_trie_rag.inputs import unique_documents
from ngram_trie_rag.validation import refuse_bytes

from .retrieved import Retrieved
from .scopes import retriever_scope

DocumentOrigin = Literal["argument", "retriever", "prompt"]
PREVIEW_CHARS = 80


def as_documents(items: Any) -> list[Document]:
    """Strings or ``Document`` objects -> ``Document`` objects; anything else is an error
    (bytes with a hint to decode them). Their content is checked where it is encoded."""
    refuse_bytes(items)
    if isinstance(items, (str, Document)) or not isinstance(items, Sequence):
        raise TypeError("documents must be a list of strings or Documents, "
                        f"got {type(items).__name__}")
    out: list[Document] = []
    for i, item in enumerate(items):
        if isinstance(item, Document):
            out.append(item)
        elif isinstance(item, str):
            out.append(Document(page_content=item))
        else:
            raise TypeError(f"document {i} is a {type(item).__name__}, "
                            "expected a string or a Document")
    return out


def draftable(documents: Sequence[Document]) -> list[Document]:
    """Drop blank documents (nothing to draft from) and repeated texts (a copy only
    doubles n-gram counts), keeping first occurrences in order, so the response names
    exactly the documents the trie was built from."""
    filled = [doc for doc in documents if doc.page_content.strip()]
    return unique_documents(filled, key=lambda doc: doc.page_content)


def describe(doc: Document) -> dict[str, Any]:
    """A short, stable reference to a document: its id and metadata when it has them,
    always a content hash and a preview, never the full text."""
    text = doc.page_content
    return {
        "id": doc.id,
        "metadata": dict(doc.metadata),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()[:16],
        "preview": text[:PREVIEW_CHARS],
    }


@dataclass(frozen=True)
class DraftDocuments:
    """What one call drafts from; an empty ``documents`` means the prompt."""

    documents: list[Document] = field(default_factory=list)
    origin: DocumentOrigin = "prompt"
    retriever_scopes: tuple[str, ...] = ()  # answer scopes of the retrievers drafted from
    answer_scope: str | None = None  # the scope whose earlier answers are drafted from too

    @property
    def texts(self) -> list[str] | None:
        """The request's ``documents`` (``None`` = draft from the prompt)."""
        return [d.page_content for d in self.documents] if self.documents else None

    def describe(self) -> list[dict[str, Any]]:
        return [describe(d) for d in self.documents]


def choose_documents(explicit: Any, retrieved: Retrieved | None) -> DraftDocuments:
    """Explicit documents, else the chain's ``retrieved`` ones, else the prompt.

    ``explicit`` is ``None`` when the caller passed none; an explicit empty list means
    "draft from the prompt" even inside a retrieval chain. ``retrieved`` is ``None`` when
    no retriever ran for the call (or the call does not use retrieved documents).
    """
    if explicit is not None:
        docs = draftable(as_documents(explicit))
        return DraftDocuments(docs, "argument" if docs else "prompt")
    if retrieved is not None:
        # A retriever ran for this call: it is in the retriever's scope even when nothing
        # draftable came back.
        scopes = tuple(retriever_scope(name, meta) for name, meta in retrieved.retrievers)
        docs = draftable(retrieved.documents)
        return DraftDocuments(docs, "retriever" if docs else "prompt", scopes)
    return DraftDocuments()
