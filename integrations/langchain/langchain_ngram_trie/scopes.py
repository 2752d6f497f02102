"""Which answer scope a model call belongs to: whose earlier answers it drafts from.

First match wins:

1. **A name in the call's metadata**: ``chain.invoke(q, config={"metadata":
   {"ngram_trie_scope": "session-42"}})``, or ``llm.with_config(metadata=...)``.
   LangChain hands metadata down to every run of the call, so a name on the chain reaches
   the model. One user's session, one tenant, one document set: the caller knows best.
2. **The retriever whose documents the call drafts from.** Follow-up questions come back
   through the same retriever, and their answers repeat each other. A retriever is known by
   what LangChain's callbacks show of it: a ``ngram_trie_scope`` in its metadata
   (``NGramTrieRetriever`` carries one naming its index), else its run name and the
   ``ls_*`` descriptors LangChain adds (retriever kind, vector store and embedding
   classes). Retrievers alike in all of these (two ``InMemoryVectorStore`` retrievers over
   the same embedding class) count as one: name them, ``store.as_retriever(metadata=
   {"ngram_trie_scope": "manuals"})``. Sibling retrievers merged into one call give a
   scope of their own.
3. **None** when no retriever ran for the call (documents passed with ``documents=``, or
   the prompt alone) and no name was given: such a call keeps no answers. The chain is no
   substitute: every unnamed LCEL chain is a ``RunnableSequence`` and every bare call is
   the model's own name, so keying on them would pool unrelated calls, which is what
   scopes exist to prevent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY, joined_scope, scope_name

# LangChain's descriptors of a retriever, in the metadata of its callbacks.
LS_KEYS = ("ls_retriever_name", "ls_vector_store_provider", "ls_embedding_provider",
           "ls_embedding_model")
AMBIGUOUS = object()  # several open model runs could be this call, naming different scopes


def retriever_scope(name: str | None, metadata: Mapping[str, Any]) -> str:
    """A retriever run's scope from its ``on_retriever_start`` name and metadata."""
    named = scope_name(metadata.get(SCOPE_KEY), f"a retriever's metadata[{SCOPE_KEY!r}]")
    if named is not None:
        return named
    parts = [name or "retriever", *(str(metadata[k]) for k in LS_KEYS if metadata.get(k))]
    return "retriever:" + "/".join(parts)


def named_scope(names: Sequence[Any]) -> Any:
    """The name the call's metadata gives (``None``: none), from the names found for
    each run that could be this call; ``AMBIGUOUS`` when they disagree."""
    distinct = {repr(n): n for n in names}
    if len(distinct) > 1:
        return AMBIGUOUS
    found = next(iter(distinct.values()), None)
    return scope_name(found, f"metadata[{SCOPE_KEY!r}]")


def call_scope(names: Sequence[Any], retriever_scopes: Sequence[str]) -> str | None:
    """The call's scope: a name from its metadata, else its retrievers', else ``None``
    (also when its own run cannot be told apart from another naming a different scope:
    no store is safer than another scope's)."""
    named = named_scope(names)
    if named is AMBIGUOUS:
        return None
    return named if named is not None else joined_scope(retriever_scopes)
