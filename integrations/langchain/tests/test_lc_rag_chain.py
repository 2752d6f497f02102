"""The canonical LCEL RAG chain, unchanged, with real MiniLM retrieval and the real model:
the trie is built from exactly the documents this call retrieved, and the answer is the
plain greedy answer, under invoke, stream, batch and 16 concurrent ainvokes."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnablePassthrough

from langchain_ngram_trie import ChatNGramTrie, document_registry

K = 2
TOKENS = 40
SHORT = 16  # the concurrency test checks isolation; short answers keep it quick


@pytest.fixture(scope="module")
def retriever(vector_store):
    return vector_store.as_retriever(search_kwargs={"k": K})


def rag_chain(retriever, fmt, prompt, llm):
    return ({"context": retriever | fmt, "question": RunnablePassthrough()}
            | prompt | llm | StrOutputParser())


@pytest.fixture(scope="module")
def chain(retriever, fmt, rag_prompt):
    return rag_chain(retriever, fmt, rag_prompt, ChatNGramTrie(max_tokens=TOKENS, num_draft=8))


@pytest.fixture(scope="module")
def reference(retriever, fmt, rag_prompt, plain_greedy_chat):
    """Plain greedy answers of the same chain, computed once per question."""
    chain = rag_chain(retriever, fmt, rag_prompt, plain_greedy_chat(TOKENS))
    cache: dict[str, str] = {}

    def answer(question: str) -> str:
        if question not in cache:
            cache[question] = chain.invoke(question)
        return cache[question]

    return answer


def retrieved_ids(retriever, question: str) -> list[str]:
    return [d.id for d in retriever.invoke(question)]


def drafted_ids(metadata: dict) -> list[str]:
    spec = metadata["speculative"]
    assert spec["draft_source"] == "documents" and spec["documents_from"] == "retriever"
    assert spec["num_documents"] == len(spec["documents"])
    return [d["id"] for d in spec["documents"]]


def test_invoke_drafts_from_the_retrieved_documents_and_equals_greedy(
        chain, retriever, reference, recorder, hagrid, held_before):
    question = hagrid[1][0]
    answer = chain.invoke(question, config={"callbacks": [recorder]})
    assert answer == reference(question)
    meta = recorder.by_question[question]
    assert drafted_ids(meta) == retrieved_ids(retriever, question)
    spec = meta["speculative"]
    assert spec["steps"] == len(spec["accept_lengths"]) > 0
    assert spec["mean_accept_length"] > 1.0  # the answer copies from the passages
    assert meta["finish_reason"] in ("eos", "length")
    assert document_registry().size == held_before  # this call left no entry


def test_stream_and_astream_events(chain, retriever, reference, hagrid, held_before):
    """``_stream`` gets no run manager: the documents are found through the config."""
    question = hagrid[1][9]
    assert "".join(chain.stream(question)) == reference(question)

    async def last_model_chunk() -> dict:
        final = None
        async for event in chain.astream_events(question, version="v2"):
            if event["event"] == "on_chat_model_end":
                final = event["data"]["output"]
        return final.response_metadata

    meta = asyncio.run(last_model_chunk())
    assert drafted_ids(meta) == retrieved_ids(retriever, question)
    assert document_registry().size == held_before  # this call left no entry


def test_batch_gives_each_question_its_own_documents(chain, retriever, reference, recorder,
                                                      hagrid, held_before):
    questions = hagrid[1][2:6]
    answers = chain.batch(questions, config={"callbacks": [recorder]})
    assert answers == [reference(q) for q in questions]
    for question in questions:
        assert drafted_ids(recorder.by_question[question]) == retrieved_ids(retriever, question)
    assert len({tuple(retrieved_ids(retriever, q)) for q in questions}) > 1
    assert document_registry().size == held_before  # this call left no entry


async def test_eight_concurrent_ainvokes_stay_isolated(retriever, fmt, rag_prompt,
                                                       reference, recorder, hagrid,
                                                       held_before):
    questions = hagrid[1][:8]
    assert len(questions) == 8
    chain = rag_chain(retriever, fmt, rag_prompt, ChatNGramTrie(max_tokens=SHORT))
    answers = await asyncio.gather(
        *(chain.ainvoke(q, config={"callbacks": [recorder]}) for q in questions))
    for question in questions:
        assert drafted_ids(recorder.by_question[question]) == retrieved_ids(retriever, question)
    # Greedy answers of SHORT tokens start the longer plain greedy ones (checked for the
    # questions whose reference the batch test already computed).
    for question, answer in zip(questions[2:6], answers[2:6], strict=True):
        assert answer and reference(question).startswith(answer)
    assert document_registry().size == held_before  # this call left no entry
