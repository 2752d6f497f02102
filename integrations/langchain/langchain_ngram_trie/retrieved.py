"""The documents retrieved under each live LangChain run, and what a model call finds above it.

In ``{"context": retriever | fmt, "question": ...} | prompt | llm`` the retriever and the
model are siblings: a context variable set while retrieving never reaches the model (each
branch of a parallel step runs in a copied context). Run ids and parent links do reach
both, so this store keeps:

* ``run -> parent`` for every chain, tool, retriever and model run;
* a retriever's documents, filed under its run and every ancestor;
* the answer scope a run's metadata names (``ngram_trie_scope``), and what identifies each
  retriever (its run name and metadata), so a model call can tell its scope (``scopes``).

A model call walks up from its own run to the nearest ancestor holding documents.

Nesting: a retriever that wraps another (reranking, compression) ends after the one inside
it, and its filing replaces the inner one's at every shared ancestor, so the outermost
retriever wins (a reranker's top-n, not the candidates it chose from). Sibling retrievers
(two branches of one chain) are both kept, in the order they finished.

Lifetime: when a root run ends (a run whose parent was never seen), everything filed under
its tree is dropped, so nothing outlives the chain call that produced it. Thread-safe:
batches run on threads, async callbacks on executors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.documents import Document
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY

RetrieverInfo = tuple[str | None, dict[str, Any]]  # (run name, scope name and ls_* metadata)


@dataclass(frozen=True)
class Retrieved:
    """What the retrievers above a call returned, and which retrievers they were."""

    documents: list[Document]
    retrievers: list[RetrieverInfo]  # one per retriever, in finishing order


@dataclass(frozen=True)
class Found:
    """What one model call finds above it, read at once so both halves agree."""

    retrieved: Retrieved | None  # None: no retriever ran above the call
    scope_names: list[Any]  # see RunStore.lookup


class RunStore:
    """Live runs, their parents, and what was retrieved and named under them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parent: dict[UUID, UUID | None] = {}  # None: a root, as far as we saw
        self._root: dict[UUID, UUID] = {}
        self._members: dict[UUID, set[UUID]] = {}  # root -> every run of its tree
        # run -> {retriever run -> its documents}, insertion order = finishing order
        self._filed: dict[UUID, dict[UUID, list[Document]]] = {}
        self._named: dict[UUID, Any] = {}  # run -> the scope its metadata names
        self._retrievers: dict[UUID, RetrieverInfo] = {}  # retriever run -> who it is
        self._open_models: dict[UUID, UUID | None] = {}  # model run -> parent, until it ends

    @property
    def size(self) -> int:
        """Entries held (runs, trees and filings); 0 once every chain call has ended."""
        with self._lock:
            return (len(self._parent) + len(self._members) + len(self._filed)
                    + len(self._named) + len(self._retrievers) + len(self._open_models))

    def lookup(self, run_id: UUID | None, parent_run_id: UUID | None = None) -> Found:
        """What a model call (``run_id``, else its parent's ``parent_run_id``) finds.

        ``retrieved``: the documents filed at the nearest ancestor of ``run_id`` (itself
        included), or of ``parent_run_id`` when ``run_id`` is unknown.

        ``scope_names``: the scope named in the call's metadata (``None``: none), one entry
        per run that may be the call's own: its run when known; else the model runs open
        under ``parent_run_id`` (``BaseChatModel.stream`` hands the model no run manager,
        and the model run's metadata, unlike the parent's, includes ``with_config`` on the
        model); else the parent itself. Several entries must agree to be trusted.
        """
        with self._lock:
            known = run_id in self._parent
            if known:
                starts: list[UUID | None] = [run_id]
            else:
                starts = [run for run, parent in self._open_models.items()
                          if parent == parent_run_id] or [parent_run_id]
            return Found(self._retrieved_above(run_id if known else parent_run_id),
                         [self._name_above(start) for start in starts])

    def _retrieved_above(self, start: UUID | None) -> Retrieved | None:
        for node in self._ancestors(start):
            filed = self._filed.get(node)
            if filed:
                return Retrieved([doc for docs in filed.values() for doc in docs],
                                 [self._retrievers.get(r, (None, {})) for r in filed])
        return None

    def _ancestors(self, run_id: UUID | None) -> Iterator[UUID]:
        node = run_id
        while node is not None and node in self._parent:
            yield node
            node = self._parent[node]

    def _name_above(self, run_id: UUID | None) -> Any:
        for node in self._ancestors(run_id):
            if node in self._named:
                return self._named[node]
        return None

    # ---- updates ------------------------------------------------------------------------
    def link(self, run_id: UUID, parent_run_id: UUID | None,
             metadata: Mapping[str, Any] | None = None) -> None:
        """A run started under ``parent_run_id`` (a root when that parent is unknown)."""
        with self._lock:
            if run_id in self._parent:
                return
            if metadata and metadata.get(SCOPE_KEY) is not None:
                self._named[run_id] = metadata[SCOPE_KEY]  # checked when a model reads it
            known = parent_run_id is not None and parent_run_id in self._parent
            parent = parent_run_id if known else None
            root = self._root[parent] if parent is not None else run_id
            self._parent[run_id] = parent
            self._root[run_id] = root
            self._members.setdefault(root, set()).add(run_id)

    def retriever_started(self, run_id: UUID, info: RetrieverInfo) -> None:
        with self._lock:
            self._retrievers[run_id] = info

    def model_started(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            self._open_models[run_id] = parent_run_id

    def model_ended(self, run_id: UUID) -> None:
        with self._lock:
            self._open_models.pop(run_id, None)
        self.end(run_id)

    def file(self, run_id: UUID, parent_run_id: UUID | None,
             documents: Sequence[Document]) -> None:
        """A retriever returned ``documents``: file them at its run and every ancestor,
        in place of what the retrievers it wraps filed there."""
        self.link(run_id, parent_run_id)
        with self._lock:
            docs = list(documents)
            for node in list(self._ancestors(run_id)):
                filed = self._filed.setdefault(node, {})
                inner = [r for r in filed if run_id in self._ancestors(r)]
                for retriever in inner:  # this retriever wraps them: its result wins
                    del filed[retriever]
                filed[run_id] = docs

    def end(self, run_id: UUID) -> None:
        """A run ended. A root takes its whole tree with it; other runs keep their entries,
        since a later sibling (the model) may still need what they filed."""
        with self._lock:
            if self._root.get(run_id) != run_id:
                return
            for member in self._members.pop(run_id, ()):
                self._parent.pop(member, None)
                self._root.pop(member, None)
                self._filed.pop(member, None)
                self._named.pop(member, None)
                self._retrievers.pop(member, None)
                self._open_models.pop(member, None)
