"""Which retrieved nodes belong to the LLM call that is running now.

A query engine hands the retrieved nodes to a response synthesizer, which formats them into
a prompt and calls the LLM: the LLM itself only ever sees the prompt. Every step runs inside
nested instrumentation spans, e.g.

    RetrieverQueryEngine.query > ._query > CompactAndRefine.synthesize > LLM.predict > .chat

so a span handler on the root dispatcher can remember the nodes at the span that received
them, and the LLM walks up from its own span to the nearest remembered list. Spans are
per task and per thread (a ContextVar), so concurrent queries never see each other's nodes.

What is remembered:

- entering ``BaseSynthesizer.synthesize`` / ``asynthesize``: its ``nodes`` argument, which is
  exactly what the prompt is built from (after every node postprocessor, e.g. a reranker);
- leaving ``BaseRetriever.retrieve`` / ``aretrieve`` and a postprocessor's
  ``_postprocess_nodes`` / ``_apostprocess_nodes``: the result, filed under the *caller's*
  span, for pipelines that call the LLM without a synthesizer. A later record at the same
  span replaces the earlier one, so a postprocessor's output replaces the retriever's.

Beside the nodes, the answer scope of each retrieval (see ``scopes``): leaving a
retriever's ``retrieve`` files the retriever's scope under the caller's span, and leaving any
span moves the scopes filed under it to its parent, so they stay visible to every later call
of the query (the synthesizer is the retriever's sibling or a relative further off).

Every record is dropped when its span exits or is dropped, so nothing outlives the query.

Streaming trap: a streaming synthesizer may return a lazy generator that calls the LLM only
when the caller first reads it, after every span of the query has closed. So when
``synthesize`` returns a ``StreamingResponse``, its ``response_gen`` is wrapped to carry the
nodes, their scope and the query's instrument tags into each read (see ``carry``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import AsyncStreamingResponse, StreamingResponse
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.dispatcher import active_instrument_tags
from llama_index.core.instrumentation.span import BaseSpan, active_span_id
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.response_synthesizers.base import BaseSynthesizer
from llama_index.core.schema import NodeWithScore
from ngram_trie_rag.wrappers.answer_scopes import joined_scope, object_scope
from pydantic import PrivateAttr

from .carry import STREAMED, Retrieved, carry
from .scopes import retriever_scope

_UUID_SUFFIX = 37  # span ids are f"{Class}.{method}-{uuid4()}": a dash and 36 characters
_SYNTHESIZE = frozenset({"synthesize", "asynthesize"})
_RETRIEVE = frozenset({"retrieve", "aretrieve"})
_POSTPROCESS = frozenset({"_postprocess_nodes", "_apostprocess_nodes"})


def _method_name(span_id: str) -> str:
    return span_id[:-_UUID_SUFFIX].rsplit(".", 1)[-1]


class RetrievedNodesTracker(BaseSpanHandler[BaseSpan]):
    """Span handler that files retrieved nodes under the span that received them.

    It keeps only a parent link per open span and the node lists, both in plain dicts, and
    creates no span objects: it runs on every span of the process, so it must stay cheap.
    """

    _parents: dict[str, str | None] = PrivateAttr(default_factory=dict)
    _nodes: dict[str, list[NodeWithScore]] = PrivateAttr(default_factory=dict)
    _scopes: dict[str, frozenset[str]] = PrivateAttr(default_factory=dict)
    _guard: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "RetrievedNodesTracker"

    # ---- what the dispatcher calls ------------------------------------------------
    def span_enter(self, id_: str, bound_args: inspect.BoundArguments,
                   instance: Any | None = None, parent_id: str | None = None,
                   tags: dict[str, Any] | None = None, **kwargs: Any) -> None:
        nodes = None
        if isinstance(instance, BaseSynthesizer) and _method_name(id_) in _SYNTHESIZE:
            nodes = bound_args.arguments.get("nodes")
        with self._guard:
            self._parents[id_] = parent_id
            if nodes is not None:
                self._nodes[id_] = list(nodes)

    def span_exit(self, id_: str, bound_args: inspect.BoundArguments,
                  instance: Any | None = None, result: Any | None = None,
                  **kwargs: Any) -> None:
        retrieving = isinstance(instance, BaseRetriever) and _method_name(id_) in _RETRIEVE
        with self._guard:
            parent = self._parents.pop(id_, None)
            nodes = self._nodes.pop(id_, None)
            scopes = self._scopes.pop(id_, frozenset())
            if retrieving:  # the retrievers it called are part of what it returned
                scopes = frozenset({_scope_of(instance, scopes)})
            open_parent = parent is not None and parent in self._parents
            if open_parent and scopes:
                self._scopes[parent] = self._scopes.get(parent, frozenset()) | scopes
            if nodes is not None and isinstance(result, StreamingResponse | AsyncStreamingResponse):
                carried = Retrieved(nodes, self._scope_above(parent))
                result.response_gen = carry(result.response_gen, carried,
                                             dict(active_instrument_tags.get() or {}))
            if open_parent and _is_node_list(result) and (
                retrieving or (isinstance(instance, BaseNodePostprocessor)
                               and _method_name(id_) in _POSTPROCESS)
            ):
                self._nodes[parent] = list(result)

    def span_drop(self, id_: str, bound_args: inspect.BoundArguments,
                  instance: Any | None = None, err: BaseException | None = None,
                  **kwargs: Any) -> None:
        with self._guard:
            self._parents.pop(id_, None)
            self._nodes.pop(id_, None)
            self._scopes.pop(id_, None)

    # The base class's hooks for span objects: this handler keeps none.
    def new_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_to_exit_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_to_drop_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    # ---- what the LLM asks ----------------------------------------------------------
    def nodes_for(self, span_id: str | None) -> list[NodeWithScore] | None:
        """The nodes recorded nearest above ``span_id`` (itself included), or ``None``.

        An empty list is an answer too ("retrieval found nothing"), not a reason to look
        further up at an older query's nodes.
        """
        with self._guard:
            seen = 0
            while span_id is not None and seen <= len(self._parents):
                if span_id in self._nodes:
                    return list(self._nodes[span_id])
                span_id = self._parents.get(span_id)
                seen += 1  # a cycle cannot happen, but never loop forever on bad input
        return None

    def scope_for(self, span_id: str | None) -> str | None:
        """The answer scope of the retrievals recorded nearest above ``span_id`` (itself
        included), or ``None`` when no retriever ran above it."""
        with self._guard:
            return self._scope_above(span_id)

    def _scope_above(self, span_id: str | None) -> str | None:
        seen = 0
        while span_id is not None and seen <= len(self._parents):
            if span_id in self._scopes:
                return joined_scope(self._scopes[span_id])
            span_id = self._parents.get(span_id)
            seen += 1
        return None

    def current(self) -> Retrieved | None:
        """The nodes for the call starting now, with their scope: those of the streamed
        response being read, else the nearest recorded above the span active in this task
        or thread; ``None`` when none were."""
        streamed = STREAMED.get()
        if streamed is not None:
            return Retrieved(list(streamed.nodes), streamed.scope)
        span = active_span_id.get()
        nodes = self.nodes_for(span)
        return None if nodes is None else Retrieved(nodes, self.scope_for(span))

    @property
    def num_records(self) -> int:
        """How many node lists and scope records are held now; 0 whenever no query is
        running."""
        with self._guard:
            return len(self._nodes) + len(self._scopes)

    @property
    def num_open_spans(self) -> int:
        """How many spans this handler is following now."""
        with self._guard:
            return len(self._parents)


def _scope_of(retriever: Any, inner: frozenset[str]) -> str:
    """``retriever_scope``, never raising: this runs inside every query's spans."""
    try:
        return retriever_scope(retriever, sorted(inner))
    except Exception:  # an odd retriever attribute must not break the query
        return f"retriever:{object_scope(retriever)}"


def _is_node_list(value: Any) -> bool:
    return isinstance(value, Sequence) and all(isinstance(n, NodeWithScore) for n in value)


_TRACKER: RetrievedNodesTracker | None = None
_INSTALL_LOCK = threading.Lock()


def get_tracker() -> RetrievedNodesTracker:
    """The process-wide tracker, attached to the root dispatcher on first use.

    Re-attached if someone replaced the root dispatcher's handler list (a span that was
    already open then is simply not found, and the call drafts from its prompt).
    """
    global _TRACKER
    with _INSTALL_LOCK:
        if _TRACKER is None:
            _TRACKER = RetrievedNodesTracker()
        root = get_dispatcher()
        if not any(h is _TRACKER for h in root.span_handlers):
            root.add_span_handler(_TRACKER)
        return _TRACKER


def registry_size() -> int:
    """Node lists and scope records held right now (0 after every query has finished):
    a leak check."""
    return get_tracker().num_records
