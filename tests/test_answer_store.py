"""AnswerStore on tiny hand-made answers, and a Drafter drafting from one (no model)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ngram_trie_rag import AnswerStore
from ngram_trie_rag.drafting import DraftConfig, Drafter
from ngram_trie_rag.drafting.answer_store import answer_tokens, check_answer_store


def test_evicts_oldest_first_past_the_token_cap() -> None:
    store = AnswerStore(max_tokens=10, min_tokens=1)
    store.add([1, 2, 3, 4])
    store.add([5, 6, 7])
    store.add([8, 9, 10])
    assert store.tokens == 10 and len(store) == 3
    store.add([11, 12])  # 12 tokens > 10: the oldest answer goes, the others stay
    assert store.answers() == [(5, 6, 7), (8, 9, 10), (11, 12)]
    assert store.tokens == 8
    store.add([13, 14, 15, 16, 17, 18])  # 14 > 10: two oldest go, in order
    assert store.answers() == [(11, 12), (13, 14, 15, 16, 17, 18)]


def test_an_answer_longer_than_the_cap_keeps_its_end() -> None:
    store = AnswerStore(max_tokens=3, min_tokens=1)
    store.add([1, 2])
    store.add([4, 5, 6, 7, 8])
    assert store.answers() == [(6, 7, 8)] and store.tokens == 3


def test_short_answers_are_skipped_and_repeats_refreshed() -> None:
    store = AnswerStore(max_tokens=100, min_tokens=3)
    assert not store.add([]) and not store.add([1, 2])
    assert store.add([1, 2, 3]) and store.add(np.array([4, 5, 6]))
    assert store.add((1, 2, 3))  # held already: moved to the newest place, not doubled
    assert store.answers() == [(4, 5, 6), (1, 2, 3)] and store.tokens == 6


def test_snapshot_clear_and_repr() -> None:
    store = AnswerStore(max_tokens=100, min_tokens=1)
    store.add([1, 2])
    snapshot = store.answers()
    store.add([3, 4])
    assert snapshot == [(1, 2)]  # a copy: later adds do not reach it
    assert "2 answers" in repr(store)
    store.clear()
    assert len(store) == 0 and store.tokens == 0 and store.answers() == []


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"max_tokens": 0}, ValueError), ({"max_tokens": 2.5}, TypeError),
    ({"max_tokens": True}, TypeError), ({"min_tokens": 0}, ValueError),
])
def test_bad_settings(kwargs: dict, error: type) -> None:
    with pytest.raises(error, match="_tokens"):
        AnswerStore(**kwargs)


def test_bad_answers() -> None:
    store = AnswerStore(min_tokens=1)
    with pytest.raises(ValueError, match="token id"):
        store.add([1, -2])
    with pytest.raises(TypeError, match="token id"):
        store.add([1, 2.0])
    with pytest.raises(TypeError, match="sequence of token ids"):
        store.add("some text")
    assert len(store) == 0


def test_check_answer_store_names_the_option() -> None:
    store = AnswerStore()
    assert check_answer_store(store) is store and check_answer_store(None) is None
    with pytest.raises(TypeError, match="answer_store must be an AnswerStore"):
        check_answer_store([[1, 2, 3]])


def test_answer_tokens_drop_the_closing_eos_only() -> None:
    assert answer_tokens([5, 6, 2], frozenset({2})) == [5, 6]
    assert answer_tokens([2, 5, 6], frozenset({2})) == [2, 5, 6]
    assert answer_tokens([], frozenset({2})) == []


def test_threads_adding_at_once_keep_the_cap_and_the_count() -> None:
    store = AnswerStore(max_tokens=1000, min_tokens=1)
    start = threading.Barrier(4)

    def add_many(worker: int) -> None:
        start.wait()
        for i in range(300):
            store.add([worker, i, i + 1, i + 2])  # distinct answers, 4 tokens each

    threads = [threading.Thread(target=add_many, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    answers = store.answers()
    assert store.tokens == sum(map(len, answers)) == 1000  # 250 answers of 4 tokens
    assert len(answers) == len(set(answers)) == 250
    for worker in range(4):  # each thread's own answers stay in the order it added them
        mine = [a[1] for a in answers if a[0] == worker]
        assert mine == sorted(mine)


def test_drafter_drafts_from_earlier_answers() -> None:
    # no documents hold "2 3 -> 4 5"; an earlier answer does
    config = DraftConfig(n=6, prefix_len=3, num_draft=4, adaptive=False)
    alone = Drafter.for_request(config, [9, 2, 3], [[7, 8, 7]])
    assert len(alone.propose(room=10)) == 0 and alone.num_answers == 0
    drafter = Drafter.for_request(config, [9, 2, 3], [[7, 8, 7]], answers=[(1, 2, 3, 4, 5)])
    assert drafter.source == "documents" and drafter.num_documents == 1
    assert drafter.num_answers == 1
    assert drafter.propose(room=10).paths() == [(4,), (4, 5)]


def test_answers_rank_by_frequency_like_documents() -> None:
    # "2 3" goes on with 4 in two answers and with 6 in one document: 4 ranks first
    config = DraftConfig(n=4, prefix_len=2, num_draft=2, adaptive=False)
    answers = [(2, 3, 4), (1, 2, 3, 4)]
    drafter = Drafter.for_request(config, [2, 3], [[2, 3, 6]], answers=answers)
    assert drafter.propose(room=1).paths() == [(4,), (6,)]
    assert drafter.trie.num_documents == 4  # two answers, one document, this answer


def test_prompt_source_still_continues_the_prompt() -> None:
    # with no documents the answer extends the prompt: answers go in before it
    config = DraftConfig(n=4, prefix_len=2, num_draft=8, adaptive=False)
    drafter = Drafter.for_request(config, [1, 2], None, answers=[(5, 6, 7)])
    assert drafter.source == "prompt" and drafter.num_answers == 1
    drafter.update([3])
    drafter.update([1, 2])  # "1 2" occurred in the prompt, continued by the answer's 3
    assert drafter.propose(room=8).paths()[0] == (3,)
