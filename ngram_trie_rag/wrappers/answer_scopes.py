"""One :class:`~ngram_trie_rag.AnswerStore` per answer scope, for the framework wrappers.

An ``AnswerStore`` is one scope: answers added to it are drafted from by every later
request given it, and by no other. A wrapper serves many scopes at once (each retriever
or index its documents come from, or a name the caller gives), so it keeps a store per
scope and hands each call the store of the call's scope. Concurrent calls of different
scopes hold different store objects and never see each other's answers; calls of one
scope share its store, which is thread-safe.

Memory is bounded twice: at most ``max_scopes`` stores (the least recently used scope
is dropped whole when a new one arrives) and ``max_tokens_per_scope`` tokens in each
(the store drops its oldest answers first). A token held costs about 36 bytes (a Python
int in a tuple), so the defaults hold at most 64 x 20,000 tokens, about 46 MB.

The wrappers' settings, with the same names in LangChain and LlamaIndex:

* ``remember_answers`` (``True``): scoped stores on. On by default because drafts decide
  only how many tokens a step verifies, never which: greedy output is unchanged, and so
  is the sampling distribution. A *seeded* sampled call skips its scope's store, since its
  draws follow the draft tree and a seed asks for a repeatable answer.
* ``answer_store`` (``None``): one store for every call, whatever its scope. The opt-in to
  share answers across scopes (a pool shared by unrelated requests mixes their phrases
  into every draft and costs acceptance), used for every call, seeded ones too.
* ``max_answer_scopes`` (64) and ``max_tokens_per_scope`` (20,000): the two bounds above.

Framework-free: each wrapper finds a call's scope (LangChain callbacks, LlamaIndex
spans) and asks :meth:`AnswerMemory.store_for` for its store.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..drafting.answer_store import AnswerStore, check_answer_store
from ..validation import flag, integer

SCOPE_KEY = "ngram_trie_scope"  # where a caller names a scope (metadata, instrument tags)
SHARED = "shared"  # the scope reported for calls that use a pinned answer_store
DEFAULT_MAX_SCOPES = 64
DEFAULT_TOKENS_PER_SCOPE = 20_000
# The wrapper fields, by name; only the local engine reads them (vLLM drafts on its own).
SETTINGS = ("remember_answers", "answer_store", "max_answer_scopes", "max_tokens_per_scope")


class AnswerScopes:
    """Scope name -> its ``AnswerStore``, at most ``max_scopes`` of them, least recently
    used dropped first; thread-safe.

    Example::

        scopes = AnswerScopes(max_scopes=2)
        a = scopes.store("a"); scopes.store("b")
        scopes.store("a") is a        # True: "a" is now the most recently used
        scopes.store("c")             # a third scope: "b" is dropped, with its answers
        scopes.scopes()               # -> ["a", "c"]

    A call that got a store before its scope was dropped keeps using that object; its
    answer then goes with it, and the scope starts afresh when it comes back.
    """

    def __init__(self, max_scopes: int = DEFAULT_MAX_SCOPES,
                 max_tokens_per_scope: int = DEFAULT_TOKENS_PER_SCOPE) -> None:
        self.max_scopes = integer("max_answer_scopes", max_scopes, low=1)
        self.max_tokens_per_scope = integer("max_tokens_per_scope", max_tokens_per_scope,
                                            low=1)
        self._lock = threading.Lock()
        self._stores: OrderedDict[str, AnswerStore] = OrderedDict()  # least recent first

    def store(self, scope: str) -> AnswerStore:
        """The store of ``scope``, made if it has none (dropping the least recently used
        scope when ``max_scopes`` are held); ``scope`` becomes the most recently used."""
        with self._lock:
            found = self._stores.get(scope)
            if found is not None:
                self._stores.move_to_end(scope)
                return found
            made = AnswerStore(self.max_tokens_per_scope)
            self._stores[scope] = made
            while len(self._stores) > self.max_scopes:
                self._stores.popitem(last=False)
            return made

    def get(self, scope: str) -> AnswerStore | None:
        """The store of ``scope`` if it has one, without making one or reordering."""
        with self._lock:
            return self._stores.get(scope)

    def scopes(self) -> list[str]:
        """Scopes held, least recently used first."""
        with self._lock:
            return list(self._stores)

    def forget(self, scope: str) -> bool:
        """Drop one scope's answers (e.g. when its index was rebuilt); ``True`` if held."""
        with self._lock:
            return self._stores.pop(scope, None) is not None

    def clear(self) -> None:
        """Drop every scope."""
        with self._lock:
            self._stores.clear()

    def __contains__(self, scope: object) -> bool:
        with self._lock:
            return scope in self._stores

    def __len__(self) -> int:
        return len(self._stores)

    def __repr__(self) -> str:
        return (f"AnswerScopes({len(self)}/{self.max_scopes} scopes, "
                f"{self.max_tokens_per_scope} tokens each)")


@dataclass(frozen=True)
class AnswerMemory:
    """A wrapper's answer settings, checked, and the scoped stores they govern."""

    remember: bool = True
    shared: AnswerStore | None = None
    scopes: AnswerScopes = field(default_factory=AnswerScopes)

    @classmethod
    def from_settings(cls, remember_answers: Any = True, answer_store: Any = None,
                      max_answer_scopes: Any = DEFAULT_MAX_SCOPES,
                      max_tokens_per_scope: Any = DEFAULT_TOKENS_PER_SCOPE, *,
                      given: Iterable[str] = ()) -> AnswerMemory:
        """Check the four settings (``given``: the ones the caller set) and build."""
        check_answer_settings(remember_answers, answer_store, given)
        return cls(flag("remember_answers", remember_answers), check_answer_store(answer_store),
                   AnswerScopes(max_answer_scopes, max_tokens_per_scope))

    def store_for(self, scope: str | None, *,
                  seeded_sampling: bool = False) -> tuple[AnswerStore | None, str | None]:
        """``(store, reported scope)`` for a call of ``scope`` (``None``: it has none).

        The pinned store serves every call; otherwise a call with a scope gets that
        scope's store, unless scoped stores are off or the call samples with a seed."""
        if self.shared is not None:
            return self.shared, SHARED
        if not self.remember or scope is None or seeded_sampling:
            return None, None
        return self.scopes.store(scope), scope


def check_answer_setting(name: str, value: Any) -> Any:
    """One setting's kind and range, named as the caller spelled it (for a field
    validator that runs before a lax parser could read ``"yes"`` as ``True``)."""
    if name == "remember_answers":
        return flag(name, value)
    if name == "answer_store":
        return check_answer_store(value)
    if name in ("max_answer_scopes", "max_tokens_per_scope"):
        return integer(name, value, low=1)
    raise KeyError(f"not an answer setting: {name!r}")


def check_answer_settings(remember_answers: Any, answer_store: Any,
                          given: Iterable[str]) -> None:
    """Settings that contradict each other: a ``ValueError`` saying why."""
    given = set(given)
    if answer_store is not None and remember_answers is False:
        raise ValueError("answer_store and remember_answers=False contradict each other: "
                         "answer_store shares one store across every call, "
                         "remember_answers=False turns answer stores off")
    bounds = sorted(given & {"max_answer_scopes", "max_tokens_per_scope"})
    if answer_store is not None and bounds:
        raise ValueError(f"{', '.join(bounds)} bound the per-scope stores, which a pinned "
                         "answer_store replaces: bound it with AnswerStore(max_tokens=...)")


def scope_name(value: Any, where: str) -> str | None:
    """A scope named by the caller (``where`` says where it was found): a non-empty
    string, or ``None`` when none was given."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a string naming an answer scope, got "
                        f"{value!r} ({type(value).__name__})")
    if not value.strip():
        raise ValueError(f"{where} must not be empty")
    return value


def joined_scope(scopes: Iterable[str]) -> str | None:
    """One scope for a call drafting from several retrievers' results (siblings in one
    chain): its own, apart from each retriever's alone. ``None`` for none."""
    names = sorted(set(scopes))
    return " + ".join(names) if names else None


_LABELS: dict[int, str] = {}  # id of a live object -> its name; dropped when it is collected
_LABELS_LOCK = threading.Lock()
_COUNTER = itertools.count(1)


def object_scope(obj: Any) -> str:
    """A process-unique name for a live object (an index, a vector store), stable for
    its lifetime: ``"VectorIndex#3"``. By identity, not equality, and never reused: a
    counter names the object, and its entry goes when the object is collected."""
    with _LABELS_LOCK:
        label = _LABELS.get(id(obj))
        if label is not None:
            return label
        label = f"{type(obj).__name__}#{next(_COUNTER)}"
        try:
            weakref.finalize(obj, _LABELS.pop, id(obj), None)
        except TypeError:  # not weakly referenceable: named by id, reused once collected
            return f"{type(obj).__name__}@{id(obj):x}"
        _LABELS[id(obj)] = label
        return label
