"""One LangChain model call as one core :class:`~ngram_trie_rag.backends.Request`.

The chat model and the string LLM differ only in the prompt they build and the response
they package; in between, each call is made the same way here: the instance's options with
the call's keywords over them, the documents to draft from (passed, else retrieved in the
enclosing chain, else none), the call's answer scope, and the grammar its answer must match.
The request then goes to the model's backend, whichever engine that is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from uuid import UUID

from ngram_trie_rag.backends import Request
from ngram_trie_rag.decoding.grammar import Grammar
from ngram_trie_rag.wrappers.settings import OPTION_FIELDS

from .documents import DraftDocuments, choose_documents
from .registry import document_registry
from .scopes import call_scope

if TYPE_CHECKING:
    from .settings import NGramTrieSettings

# Keywords LangChain itself may pass along that carry no generation option.
IGNORED_KWARGS = frozenset({"stream"})


@dataclass(frozen=True)
class Call:
    """A request, and the documents its response names (with its answer scope)."""

    request: Request
    draft: DraftDocuments


def call_keywords(model: NGramTrieSettings) -> list[str]:
    """The keywords a call takes, as a LangChain user spells them (deprecated ones aside)."""
    return sorted([*(model.spelled(core) for core in OPTION_FIELDS), "documents"])


def make_call(model: NGramTrieSettings, prompt: Any, stop: list[str] | None,
              kwargs: Mapping[str, Any], run_ids: tuple[UUID | None, UUID | None], *,
              retrieved: bool = True, grammar: Grammar | None = None,
              tool_reply: bool = False) -> Call:
    """The request for ``prompt`` with this call's ``stop`` and keywords.

    ``run_ids``: the call's run and its parent's, to find what the chain retrieved above
    it and the scope its metadata names; ``retrieved`` False drafts from documents passed
    to the call only. ``tool_reply``: the answer is parsed into content and tool calls.
    An unknown keyword is a ``TypeError`` naming the supported ones.
    """
    keywords = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
    explicit = keywords.pop("documents", None)
    supported = call_keywords(model)
    unknown = sorted(set(keywords) - set(supported) - set(model.DEPRECATED))
    if unknown:
        raise TypeError(f"unsupported keyword arguments {unknown}; "
                        f"supported: {supported}")
    if grammar is not None:
        keywords["grammar"] = grammar
    options = model.call_options(keywords, stop)
    found = document_registry().lookup(*run_ids)
    use_retrieved = retrieved and model.use_retrieved_documents
    draft = choose_documents(explicit, found.retrieved if use_retrieved else None)
    # Only an engine that drafts here keeps answers: elsewhere the scope is never read.
    scope = (call_scope(found.scope_names, draft.retriever_scopes)
             if model.active_backend.drafts_locally else None)
    options, reported = model.with_answer_store(options, scope)
    return Call(Request(prompt, draft.texts, options, tool_reply),
                replace(draft, answer_scope=reported))
