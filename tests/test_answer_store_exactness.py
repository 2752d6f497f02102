"""Drafting from earlier answers keeps greedy output exact, and stays inside its store.

Related questions over the same HAGRID documents, answered in order with one
:class:`AnswerStore`, on the real packaged model in fp32: every answer equals
``model.generate(do_sample=False)``, and a second store (another scope) never sees the
first one's answers.
"""

from __future__ import annotations

import pytest
from data_files import read_jsonl

from ngram_trie_rag import AnswerStore, SpeculativeGenerator
from ngram_trie_rag.prompts import rag_messages
from ngram_trie_rag.reference import greedy_reference

MAX_NEW = 64


def _related(question: str) -> list[str]:
    """The question, a paraphrase, and a follow-up: answers that repeat each other."""
    return [question, f"In one or two sentences: {question}",
            f"{question} Answer again, citing the passage."]


@pytest.fixture(scope="module")
def hagrid_row() -> tuple[list[str], list[str]]:
    row = read_jsonl("hagrid/hagrid.jsonl", 1)[0]
    docs = [p.strip() for p in row["context"].split("\n\n") if p.strip()]  # as the bench
    return docs, _related(row["question"])


def _answer(generator: SpeculativeGenerator, docs: list[str], question: str,
            store: AnswerStore):
    messages = rag_messages(docs, question)
    result = generator.generate(messages, docs, max_new_tokens=MAX_NEW, answer_store=store)
    expected = greedy_reference(generator.model, generator.encode_prompt(messages), MAX_NEW)
    assert result.token_ids == expected, question
    return result


@pytest.mark.slow
def test_follow_ups_with_one_store_are_exact_and_scoped(generator, hagrid_row) -> None:
    docs, questions = hagrid_row
    scope_a = AnswerStore()
    seen: list[tuple[int, ...]] = []
    for i, question in enumerate(questions):
        held = len(scope_a)
        result = _answer(generator, docs, question, scope_a)
        assert result.stats.store_answers == held
        assert result.stats.to_dict()["store_answers"] == held
        assert (held >= 1) == (i >= 1)  # drafted from the store from the second on
        answer = [t for t in result.token_ids if t not in generator.eos_token_ids]
        assert scope_a.answers()[-1] == tuple(answer)  # the new tokens, EOS dropped
        seen.append(tuple(answer))
    assert set(scope_a.answers()) == set(seen)

    scope_b = AnswerStore()  # another session over the same documents
    result = _answer(generator, docs, questions[1], scope_b)
    assert result.stats.store_answers == 0  # nothing of scope A was drafted from
    assert scope_b.answers() == [seen[1]]  # B holds its own answer only
    assert set(scope_a.answers()) == set(seen)  # and A did not learn B's


def test_answer_store_must_be_a_store(generator) -> None:
    with pytest.raises(TypeError, match="answer_store must be an AnswerStore"):
        generator.generate("Hi", answer_store=[[1, 2, 3]])


def test_a_stream_closed_early_adds_nothing(generator) -> None:
    store = AnswerStore()
    stream = generator.stream("The capital of France is", max_new_tokens=32,
                              answer_store=store)
    next(stream)
    stream.close()
    assert len(store) == 0
    generator.generate("The capital of France is", max_new_tokens=8, answer_store=store)
    assert len(store) == 1
