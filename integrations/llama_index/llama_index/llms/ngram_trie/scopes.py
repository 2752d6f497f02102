"""Which answer scope an LLM call belongs to: whose earlier answers it drafts from.

First match wins:

1. **A name in LlamaIndex's instrument tags**: ``with instrument_tags({"ngram_trie_scope":
   "session-42"}): engine.query(q)`` (``llama_index.core.instrumentation.dispatcher``).
   The tags follow the code into tasks and threads like the spans do. One user's session,
   one tenant, one document set: the caller knows best.
2. **The index the retrieved nodes came from**, found when the query's retriever returns
   (see ``tracking``). Follow-up questions come back to the same index, and their answers
   repeat each other. The retriever names it:

   * its own ``answer_scope`` string (``NGramTrieRetriever`` names its FAISS index);
   * its index's ``index_id`` (``VectorIndexRetriever`` and the other index retrievers
     keep the index as ``_index``): saved with the index, so the same after a reload;
   * its vector store object (``_vector_store``), for a retriever built on a store alone;
   * the scopes of the retrievers it called (fusion, router, auto-merging retrievers);
   * else the retriever object itself.
3. **None** when no retriever ran for the call (``documents=``, ``drafting_from``, the
   prompt alone) and no name was given: such a call keeps no answers, since nothing
   tells which other calls are related to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.instrumentation.dispatcher import active_instrument_tags
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY, joined_scope, object_scope, scope_name


def retriever_scope(retriever: Any, inner: Sequence[str] = ()) -> str:
    """The scope of the nodes ``retriever`` returned; ``inner``: the scopes of the
    retrievers it called itself."""
    own = getattr(retriever, "answer_scope", None)
    if isinstance(own, str) and own:
        return own
    index_id = getattr(getattr(retriever, "_index", None), "index_id", None)
    if isinstance(index_id, str) and index_id:
        return f"index:{index_id}"
    store = getattr(retriever, "_vector_store", None)
    if store is not None:
        return f"vector_store:{object_scope(store)}"
    return joined_scope(inner) or f"retriever:{object_scope(retriever)}"


def call_scope(retrieved_scope: str | None) -> str | None:
    """The call's scope: a name in the active instrument tags, else the scope of the
    retrievers whose nodes it drafts from (``None``: none)."""
    tags = active_instrument_tags.get() or {}
    named = scope_name(tags.get(SCOPE_KEY), f"instrument_tags[{SCOPE_KEY!r}]")
    return named if named is not None else retrieved_scope
