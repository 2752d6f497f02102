"""Answer scopes in LangChain, on the real model: a retriever's later calls draft from its
earlier answers and no other retriever's, a pinned store shares answers across retrievers,
scopes are bounded, calls with no scope keep nothing, concurrent scopes stay apart, and every
answer equals the same call's without stores."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnablePassthrough
from ngram_trie_rag import AnswerStore
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY

from langchain_ngram_trie import (
    ChatNGramTrie,
    NGramTrieLLM,
    NGramTrieRetriever,
    document_registry,
)
from langchain_ngram_trie.calls import make_call

TOKENS = 24
SHORT = 8  # answers of calls that only exercise the bookkeeping
URL = "http://127.0.0.1:8000/v1"
COLORS = "Name three colors."
ANIMALS = "Name three animals."


@pytest.fixture(scope="module")
def store_retriever(vector_store):
    return vector_store.as_retriever(search_kwargs={"k": 2})


@pytest.fixture(scope="module")
def faiss_lc_retriever(faiss_retriever):
    return NGramTrieRetriever(retriever=faiss_retriever, k=2)


def rag_chain(retriever, fmt, prompt, llm):
    return ({"context": retriever | fmt, "question": RunnablePassthrough()}
            | prompt | llm | StrOutputParser())


def spec(metadata: dict) -> dict:
    return metadata["speculative"]


def named(scope: str) -> dict:
    return {"metadata": {SCOPE_KEY: scope}}


def test_a_retrievers_second_call_drafts_from_the_first_and_answers_do_not_change(held_before,
        store_retriever, fmt, rag_prompt, recorder, hagrid):
    first_q, second_q = hagrid[1][:2]
    llm = ChatNGramTrie(max_tokens=TOKENS)
    chain = rag_chain(store_retriever, fmt, rag_prompt, llm)
    first = chain.invoke(first_q, config={"callbacks": [recorder]})
    # Streamed: the chat model gets no run manager, and still finds its scope.
    second = "".join(chain.stream(second_q, config={"callbacks": [recorder]}))
    one, two = (spec(recorder.by_question[q]) for q in (first_q, second_q))
    assert one["store_answers"] == 0 and two["store_answers"] == 1
    assert one["answer_scope"] == two["answer_scope"]
    assert one["answer_scope"].startswith("retriever:VectorStoreRetriever/vectorstore/")
    assert llm.answer_scopes.scopes() == [one["answer_scope"]]
    assert len(llm.answer_scopes.get(one["answer_scope"])) == 2

    off = ChatNGramTrie(max_tokens=TOKENS, remember_answers=False)
    plain = rag_chain(store_retriever, fmt, rag_prompt, off)
    assert [plain.invoke(q, config={"callbacks": [recorder]}) for q in (first_q, second_q)] \
        == [first, second]  # drafts change speed, never the answer
    assert spec(recorder.by_question[second_q])["store_answers"] == 0
    assert spec(recorder.by_question[second_q])["answer_scope"] is None
    assert len(off.answer_scopes) == 0
    assert document_registry().size == held_before


def test_answers_never_cross_to_another_retriever(store_retriever, faiss_lc_retriever, fmt,
                                                  rag_prompt, recorder, hagrid,
                                                  held_before):
    first_q, second_q, third_q = hagrid[1][2:5]
    llm = ChatNGramTrie(max_tokens=TOKENS)
    rag_chain(store_retriever, fmt, rag_prompt, llm).invoke(
        first_q, config={"callbacks": [recorder]})
    faiss_chain = rag_chain(faiss_lc_retriever, fmt, rag_prompt, llm)
    faiss_chain.invoke(second_q, config={"callbacks": [recorder]})
    faiss_chain.invoke(third_q, config={"callbacks": [recorder]})
    one, two, three = (spec(recorder.by_question[q]) for q in (first_q, second_q, third_q))
    assert two["store_answers"] == 0  # the other retriever's first call: nothing crossed
    assert three["store_answers"] == 1  # its own earlier answer only
    assert two["answer_scope"] == three["answer_scope"] != one["answer_scope"]
    assert two["answer_scope"].startswith("index:VectorIndex#")
    assert document_registry().size == held_before


def test_the_companion_retriever_is_scoped_by_its_index(faiss_retriever, hagrid):
    from ngram_trie_rag.retrieval import Passage, Retriever

    scope = NGramTrieRetriever(retriever=faiss_retriever).metadata[SCOPE_KEY]
    same_index = Retriever(faiss_retriever.index, top_n=1)
    assert NGramTrieRetriever(retriever=same_index, k=1).metadata[SCOPE_KEY] == scope
    passages = [Passage(id=d.id, text=d.page_content, source="hagrid") for d in hagrid[0][:3]]
    other = Retriever.build(passages, embedder=faiss_retriever.embedder)
    assert NGramTrieRetriever(retriever=other).metadata[SCOPE_KEY] != scope
    chosen = NGramTrieRetriever(retriever=other, metadata={SCOPE_KEY: "manuals", "x": 1})
    assert chosen.metadata == {SCOPE_KEY: "manuals", "x": 1}


def test_a_pinned_store_shares_answers_across_retrievers(store_retriever, faiss_lc_retriever,
                                                         fmt, rag_prompt, recorder, hagrid,
                                                         held_before):
    first_q, second_q = hagrid[1][5:7]
    shared = AnswerStore()
    llm = ChatNGramTrie(max_tokens=TOKENS, answer_store=shared)
    rag_chain(store_retriever, fmt, rag_prompt, llm).invoke(
        first_q, config={"callbacks": [recorder]})
    rag_chain(faiss_lc_retriever, fmt, rag_prompt, llm).invoke(
        second_q, config={"callbacks": [recorder]})
    two = spec(recorder.by_question[second_q])
    assert two["store_answers"] == 1 and two["answer_scope"] == "shared"
    assert len(shared) == 2 and len(llm.answer_scopes) == 0
    assert document_registry().size == held_before


def test_a_named_scope_and_calls_without_a_scope(held_before):
    llm = ChatNGramTrie(max_tokens=SHORT)
    bare = [llm.invoke(COLORS) for _ in range(2)]
    assert [spec(m.response_metadata)["answer_scope"] for m in bare] == [None, None]
    assert spec(bare[1].response_metadata)["store_answers"] == 0
    given = llm.invoke(COLORS, documents=["Red, green and blue are colors."])
    assert spec(given.response_metadata)["answer_scope"] is None  # no retriever, no name
    assert len(llm.answer_scopes) == 0

    llm.invoke(COLORS, config=named("colors"))
    again = llm.invoke(ANIMALS, config=named("colors"))
    assert spec(again.response_metadata)["store_answers"] == 1
    assert spec(again.response_metadata)["answer_scope"] == "colors"
    # Streamed straight from the model: no run manager, no enclosing chain.
    last = list(llm.stream(COLORS, config=named("colors")))[-1]
    assert spec(last.response_metadata)["store_answers"] == 2
    bound = llm.with_config(metadata={SCOPE_KEY: "colors"})
    assert spec(list(bound.stream(ANIMALS))[-1].response_metadata)["store_answers"] == 2
    assert document_registry().size == held_before


def test_the_completion_model_keeps_answers_too(held_before):
    llm = NGramTrieLLM(max_tokens=SHORT)
    result = llm.generate([COLORS, ANIMALS], metadata={SCOPE_KEY: "lists"})
    counts = [g[0].generation_info["speculative"]["store_answers"] for g in result.generations]
    assert counts == [0, 1]  # one call, two prompts: the second drafts from the first
    assert llm.answer_scopes.scopes() == ["lists"]
    assert document_registry().size == held_before


def test_scopes_are_bounded_least_recently_used_first():
    llm = ChatNGramTrie(max_tokens=SHORT, max_answer_scopes=2, max_tokens_per_scope=100)
    for scope in ("a", "b", "c"):
        llm.invoke(COLORS, config=named(scope))
    assert llm.answer_scopes.scopes() == ["b", "c"]  # "a" was dropped whole
    dropped = llm.invoke(ANIMALS, config=named("a"))
    assert spec(dropped.response_metadata)["store_answers"] == 0
    assert llm.answer_scopes.scopes() == ["c", "a"]
    kept = llm.invoke(ANIMALS, config=named("c"))
    assert spec(kept.response_metadata)["store_answers"] == 1
    assert llm.answer_scopes.get("c").max_tokens == 100


async def test_concurrent_calls_of_different_scopes_stay_apart(held_before, gen):
    llm = ChatNGramTrie(max_tokens=SHORT)
    calls = [("red", COLORS), ("red", "Name three fruits."),
             ("blue", ANIMALS), ("blue", "Name three rivers.")]
    messages = await asyncio.gather(
        *(llm.ainvoke([HumanMessage(q)], config=named(scope)) for scope, q in calls))
    for scope in ("red", "blue"):
        held = {gen.tokenizer.decode(a, skip_special_tokens=True)
                for a in llm.answer_scopes.get(scope).answers()}
        own = {m.content for (s, _), m in zip(calls, messages, strict=True) if s == scope}
        assert held == own
    assert document_registry().size == held_before


def test_a_seeded_sample_skips_its_scope():
    llm = ChatNGramTrie(max_tokens=SHORT)
    options = {"temperature": 0.8, "seed": 3, "num_draft": 8}
    first = llm.invoke(COLORS, config=named("s"), **options)
    assert spec(first.response_metadata)["answer_scope"] is None
    assert llm.invoke(COLORS, config=named("s"), **options).content == first.content
    unseeded = llm.invoke(COLORS, config=named("s"), temperature=0.8)
    assert spec(unseeded.response_metadata)["answer_scope"] == "s"


# The whole table of bad settings runs against the shared settings in
# tests/test_wrapper_settings.py; here, that both classes check with them.
@pytest.mark.parametrize(("settings", "error", "message"), [
    ({"max_answer_scopes": 0}, ValueError, "max_answer_scopes must be >= 1"),
    ({"backend": "vllm", "answer_store": AnswerStore()}, ValueError,
     "answer_store cannot be used where calls run on 'vllm'"),
])
@pytest.mark.parametrize("cls", [ChatNGramTrie, NGramTrieLLM])
def test_bad_answer_settings_fail_clearly(cls, settings, error, message):
    with pytest.raises(error, match=message):
        cls(**settings)


def test_a_bad_scope_name_fails_clearly_and_vllm_keeps_no_answers(held_before):
    llm = ChatNGramTrie(max_tokens=SHORT)
    with pytest.raises(TypeError, match=r"metadata\['ngram_trie_scope'\] must be a string"):
        llm.invoke(COLORS, config=named(42))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not be empty"):
        llm.invoke(COLORS, config=named(" "))
    server = ChatNGramTrie(base_url=URL, model="m")  # the default: silently unused
    call = make_call(server, COLORS, None, {}, (None, None))
    assert call.request.options.answer_store is None and call.draft.answer_scope is None
    assert document_registry().size == held_before
