"""Which documents did this model call's chain retrieve? A process-wide callback handler knows.

One handler, attached to every run through LangChain's configure hook, tells a
:class:`~.retrieved.RunStore` about each run as it starts and ends, and each retriever's
documents as they come back; a model call then looks up what was retrieved above it.

Installation: nothing is registered at import. The first ``ChatNGramTrie`` or
``NGramTrieLLM`` built (or the first ``document_registry()`` call) runs :func:`install`,
which adds the handler to LangChain's configure hook once per process; every run configured
from then on carries it. A model must exist before a chain containing it can run, so chains
always see the handler.

The handler never runs inline (an inline handler starves others of ``on_llm_start`` on async
paths) and defines no ``__len__``/``__bool__``: the configure hook reads ``var.get() or
...``, and an empty registry must not read as "no handler".
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.documents import Document
from langchain_core.runnables import ensure_config
from langchain_core.tracers.context import register_configure_hook
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY

from .retrieved import Found, RunStore
from .scopes import LS_KEYS


class RetrievedDocumentsRegistry(BaseCallbackHandler):
    """Maps live runs to the documents retrieved under them (see :mod:`.retrieved`)."""

    def __init__(self) -> None:
        self.runs = RunStore()

    @property
    def size(self) -> int:
        """Entries held; 0 once every chain call has ended."""
        return self.runs.size

    def lookup(self, run_id: UUID | None, parent_run_id: UUID | None = None) -> Found:
        """The documents retrieved above a model call and the scope names it may carry."""
        return self.runs.lookup(run_id, parent_run_id)

    # ---- starts link runs ---------------------------------------------------------------
    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None,
                       metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.runs.link(run_id, parent_run_id, metadata)

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None,
                      metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.runs.link(run_id, parent_run_id, metadata)

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID,
                           parent_run_id: UUID | None = None,
                           metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.runs.link(run_id, parent_run_id, metadata)
        known = {k: v for k, v in (metadata or {}).items() if k == SCOPE_KEY or k in LS_KEYS}
        self.runs.retriever_started(run_id, (kwargs.get("name"), known))

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
        self.runs.link(run_id, parent_run_id, metadata)
        self.runs.model_started(run_id, parent_run_id)

    # ---- a retriever's end files its documents; root ends clean up ------------------------
    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID,
                         parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self.runs.file(run_id, parent_run_id, documents)
        self.runs.end(run_id)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.end(run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.end(run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID,
                           **kwargs: Any) -> None:
        self.runs.end(run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.model_ended(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs.model_ended(run_id)


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
