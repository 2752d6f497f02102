"""AnswerScopes and AnswerMemory on their own (no model): one store per scope, least
recently used scopes dropped whole, the pinned store and the settings' checks."""

from __future__ import annotations

import gc
import threading

import pytest

from ngram_trie_rag import AnswerStore
from ngram_trie_rag.wrappers.answer_scopes import (
    SHARED,
    AnswerMemory,
    AnswerScopes,
    joined_scope,
    object_scope,
    scope_name,
)


def test_each_scope_has_its_own_store_and_the_least_recent_goes_first() -> None:
    scopes = AnswerScopes(max_scopes=2, max_tokens_per_scope=5)
    a = scopes.store("a")
    a.add([1, 2, 3, 4])
    assert scopes.store("b") is not a and scopes.store("a") is a  # "a" is the newest now
    scopes.store("c")  # a third scope: "b", the least recently used, goes
    assert scopes.scopes() == ["a", "c"] and "b" not in scopes
    assert scopes.get("a").answers() == [(1, 2, 3, 4)] and scopes.get("a").max_tokens == 5
    assert len(scopes.store("b")) == 0  # back, afresh
    assert scopes.forget("c") and not scopes.forget("c")
    scopes.clear()
    assert len(scopes) == 0


def test_threads_of_one_scope_share_one_store() -> None:
    scopes = AnswerScopes()
    got: list[AnswerStore] = []
    workers = [threading.Thread(target=lambda: got.append(scopes.store("s")))
               for _ in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len({id(s) for s in got}) == 1


def test_memory_hands_out_stores_by_scope() -> None:
    memory = AnswerMemory.from_settings()
    store, reported = memory.store_for("x")
    assert reported == "x" and memory.store_for("x")[0] is store
    assert memory.store_for("y")[0] is not store
    assert memory.store_for(None) == (None, None)  # no scope, no store
    assert memory.store_for("x", seeded_sampling=True) == (None, None)
    assert AnswerMemory.from_settings(remember_answers=False).store_for("x") == (None, None)
    shared = AnswerStore()
    pinned = AnswerMemory.from_settings(answer_store=shared)
    assert pinned.store_for("x") == pinned.store_for(None) == (shared, SHARED)
    assert pinned.store_for("x", seeded_sampling=True) == (shared, SHARED)


@pytest.mark.parametrize(("settings", "error", "message"), [
    ({"remember_answers": 1}, TypeError, "remember_answers must be True or False"),
    ({"max_answer_scopes": 0}, ValueError, "max_answer_scopes must be >= 1"),
    ({"max_tokens_per_scope": "9"}, TypeError, "max_tokens_per_scope must be an integer"),
    ({"answer_store": {}}, TypeError, "answer_store must be an AnswerStore"),
    ({"answer_store": AnswerStore(), "remember_answers": False}, ValueError, "contradict"),
])
def test_bad_settings_name_themselves(settings, error, message) -> None:
    with pytest.raises(error, match=message):
        AnswerMemory.from_settings(**settings)


def test_bounds_given_beside_a_pinned_store_are_refused() -> None:
    with pytest.raises(ValueError, match="max_answer_scopes bound the per-scope stores"):
        AnswerMemory.from_settings(answer_store=AnswerStore(), max_answer_scopes=3,
                                   given={"answer_store", "max_answer_scopes"})


def test_scope_names() -> None:
    assert scope_name(None, "where") is None and scope_name("s", "where") == "s"
    with pytest.raises(TypeError, match="where must be a string"):
        scope_name(3, "where")
    with pytest.raises(ValueError, match="where must not be empty"):
        scope_name("  ", "where")
    assert joined_scope(["b", "a", "b"]) == "a + b" and joined_scope([]) is None


def test_objects_are_named_by_identity_and_never_reuse_a_name() -> None:
    class Index:
        def __eq__(self, other: object) -> bool:  # equal by value: still two scopes
            return isinstance(other, Index)

        __hash__ = object.__hash__

    first, second = Index(), Index()
    name = object_scope(first)
    assert name.startswith("Index#") and object_scope(first) == name
    assert object_scope(second) != name
    del first
    gc.collect()
    assert name not in {object_scope(Index()) for _ in range(3)}
