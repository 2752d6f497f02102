"""Which documents did this model call's chain retrieve? A process-wide callback handler knows.

In ``{"context": retriever | fmt, "question": ...} | prompt | llm`` the retriever and the model
are siblings: a context variable set while retrieving never reaches the model (each branch
of a parallel step runs in a copied context). Callbacks do see both, with run ids and parent
links. So one handler, attached to every run through LangChain's configure hook:

* records ``run -> parent`` for every chain, tool, retriever and model run;
* on ``on_retriever_end`` files the documents under the retriever's run and every ancestor;
* lets a model call walk up from its own run to the nearest ancestor holding documents.

Nesting: a retriever that wraps another (reranking, compression) ends after the one inside
it, and its filing replaces the inner one's at every shared ancestor, so the outermost
retriever wins (a reranker's top-n, not the candidates it chose from). Sibling retrievers
(two branches of one chain) are both kept, in the order they finished.

Installation: nothing is registered at import. The first ``ChatNGramTrie`` or
``NGramTrieLLM`` built (or the first ``document_registry()`` call) runs :func:`install`,
which adds the handler to LangChain's configure hook once per process; every run configured
from then on carries it. A model must exist before a chain containing it can run, so chains
always see the handler.

Answer scopes: the handler also keeps, per live run, the scope named in its metadata
(``ngram_trie_scope``) and, per retriever run, what identifies the retriever (its run name
and metadata), so a model call can tell which scope it belongs to (see ``scopes``).

Lifetime: when a root run ends (a run whose parent this handler never saw), everything
filed under its tree is dropped, so nothing outlives the chain call that produced it.

The handler never runs inline (an inline handler starves others of ``on_llm_start`` on async
paths), is thread-safe (batches run on threads, async callbacks on executors) and defines no
``__len__``/``__bool__``: the configure hook reads ``var.get() or ...``, and an empty registry
must not read as "no handler".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.documents import Document
from langchain_core.runnables import ensure_config
from langchain_core.tracers.context import register_configure_hook
from ngram_trie_rag.answer_scopes import SCOPE_KEY

from .scopes import LS_KEYS

RetrieverInfo = tuple[str | None, dict[str, Any]]  # (run name, scope name and ls_* metadata)


@dataclass(frozen=True)
class Retrieved:
    """What the retrievers above a call returned, and which retrievers they were."""

    documents: list[Document]
    retrievers: list[RetrieverInfo]  # one per retriever, in finishing order


class RetrievedDocumentsRegistry(BaseCallbackHandler):
    """Maps live runs to the documents retrieved under them (see the module docstring)."""

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

    # ---- queries ------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Entries held (runs, trees and filings); 0 once every chain call has ended."""
        with self._lock:
            return (len(self._parent) + len(self._members) + len(self._filed)
                    + len(self._named) + len(self._retrievers) + len(self._open_models))

    def retrieved(self, run_id: UUID | None,
                  parent_run_id: UUID | None = None) -> Retrieved | None:
        """Documents filed at the nearest ancestor of ``run_id`` (itself included), or at
        the nearest ancestor of ``parent_run_id`` when ``run_id`` is unknown, with the
        retrievers that returned them. ``None`` when no retriever ran above this call."""
        with self._lock:
            start = run_id if run_id in self._parent else parent_run_id
            for node in self._ancestors(start):
                filed = self._filed.get(node)
                if filed:
                    return Retrieved([doc for docs in filed.values() for doc in docs],
                                     [self._retrievers.get(r, (None, {})) for r in filed])
            return None

    def documents_for(self, run_id: UUID | None,
                      parent_run_id: UUID | None = None) -> list[Document] | None:
        """The documents of :meth:`retrieved`."""
        found = self.retrieved(run_id, parent_run_id)
        return found.documents if found is not None else None

    def scope_names(self, run_id: UUID | None, parent_run_id: UUID | None = None) -> list[Any]:
        """The scope named in the call's metadata (``None``: none), one entry per run that
        may be the call's own: its run when known; else the model runs open under
        ``parent_run_id`` (``BaseChatModel.stream`` hands the model no run manager, and
        the model run's metadata, unlike the parent's, includes ``with_config`` on the
        model); else the parent itself. Several entries must agree to be trusted."""
        with self._lock:
            if run_id in self._parent:
                starts: list[UUID | None] = [run_id]
            else:
                starts = [run for run, parent in self._open_models.items()
                          if parent == parent_run_id] or [parent_run_id]
            return [self._name_above(start) for start in starts]

    # ---- bookkeeping --------------------------------------------------------------------
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

    def _link(self, run_id: UUID, parent_run_id: UUID | None,
              metadata: Mapping[str, Any] | None = None) -> None:
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

    def _end(self, run_id: UUID) -> None:
        """A root ended: forget its whole tree. Non-root ends keep their entries, since a
        later sibling (the model) may still need what they filed."""
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

    def _file(self, run_id: UUID, parent_run_id: UUID | None,
              documents: Sequence[Document]) -> None:
        self._link(run_id, parent_run_id)
        with self._lock:
            docs = list(documents)
            for node in list(self._ancestors(run_id)):
                filed = self._filed.setdefault(node, {})
                inner = [r for r in filed if run_id in self._ancestors(r)]
                for retriever in inner:  # this retriever wraps them: its result wins
                    del filed[retriever]
                filed[run_id] = docs

    # ---- callbacks: starts link runs, root ends clean up ------------------------------------
    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._link(run_id, parent_run_id, metadata)

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None,
                      metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._link(run_id, parent_run_id, metadata)

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID,
                           parent_run_id: UUID | None = None,
                           metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._link(run_id, parent_run_id, metadata)
        known = {k: v for k, v in (metadata or {}).items() if k == SCOPE_KEY or k in LS_KEYS}
        with self._lock:
            self._retrievers[run_id] = (kwargs.get("name"), known)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID,
                            parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._model_started(run_id, parent_run_id, metadata)

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID,
                     parent_run_id: UUID | None = None,
                     metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self._model_started(run_id, parent_run_id, metadata)

    def _model_started(self, run_id: UUID, parent_run_id: UUID | None,
                       metadata: dict[str, Any] | None) -> None:
        self._link(run_id, parent_run_id, metadata)
        with self._lock:
            self._open_models[run_id] = parent_run_id

    def _model_ended(self, run_id: UUID) -> None:
        with self._lock:
            self._open_models.pop(run_id, None)
        self._end(run_id)

    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID,
                         parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._file(run_id, parent_run_id, documents)
        self._end(run_id)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID,
                           **kwargs: Any) -> None:
        self._end(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._model_ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._model_ended(run_id)


_REGISTRY = RetrievedDocumentsRegistry()
# Once registered, the default makes every CallbackManager.configure() attach the handler,
# inheritably, with no change to the user's chain or config.
_HOOK: ContextVar[RetrievedDocumentsRegistry | None] = ContextVar(
    "ngram_trie_retrieved_documents", default=_REGISTRY
)
_INSTALL_LOCK = threading.Lock()
_installed = False


def install() -> RetrievedDocumentsRegistry:
    """Attach the registry to every LangChain run configured from now on; idempotent.

    Called when a model is built rather than at import, so merely importing the package
    leaves LangChain's callback configuration untouched.
    """
    global _installed
    with _INSTALL_LOCK:
        if not _installed:
            register_configure_hook(_HOOK, inheritable=True)
            _installed = True
    return _REGISTRY


def document_registry() -> RetrievedDocumentsRegistry:
    """The process-wide registry (e.g. to check ``document_registry().size == 0``),
    installed if it was not yet."""
    return install()


def call_run_ids(run_manager: Any) -> tuple[UUID | None, UUID | None]:
    """(this call's run id, its parent's) for looking up retrieved documents.

    ``BaseChatModel.stream`` calls ``_stream`` without its run manager; the config that the
    enclosing runnable set for its children still names that runnable's run, an ancestor of
    this call, which is all the lookup needs.
    """
    if run_manager is not None:
        return run_manager.run_id, run_manager.parent_run_id
    callbacks = ensure_config().get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        return None, callbacks.parent_run_id
    return None, None
