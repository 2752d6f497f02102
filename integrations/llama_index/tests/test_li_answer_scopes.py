"""Answer scopes in LlamaIndex, on the real model over real indexes: an index's later queries
draft from its earlier answers and no other index's, a pinned store shares answers across
indexes, scopes are bounded, calls with no scope keep nothing, concurrent scopes stay apart,
and every answer is token-identical to the same query's without stores."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.instrumentation.dispatcher import instrument_tags
from ngram_trie_rag import AnswerStore
from ngram_trie_rag.drafting.answer_store import answer_tokens
from ngram_trie_rag.wrappers.answer_scopes import SCOPE_KEY

from llama_index.llms.ngram_trie import NGramTrieLLM, NGramTrieRetriever, registry_size

TOKENS = 24
SHORT = 8  # answers of calls that only exercise the bookkeeping
TOP_K = 2
URL = "http://127.0.0.1:8000/v1"
COLORS = "Name three colors."
ANIMALS = "Name three animals."


@pytest.fixture(scope="module")
def other_index(li_nodes, li_embed_model):
    """A second index, over other passages than ``li_index``'s first ones."""
    return VectorStoreIndex(li_nodes[20:], embed_model=li_embed_model)


def ask(index, llm, question: str, **kwargs):
    return index.as_query_engine(llm=llm, similarity_top_k=TOP_K, **kwargs).query(question)


def spec(calls, question: str) -> dict:
    [call] = calls.about(question)
    return call


def named(scope):
    return instrument_tags({SCOPE_KEY: scope})


def test_an_indexs_second_query_drafts_from_the_first_and_tokens_do_not_change(
        li_index, li_calls):
    first_q, second_q = "Who was Evan Morris?", "What was Evan Morris known for?"
    llm = NGramTrieLLM(max_new_tokens=TOKENS)
    ask(li_index, llm, first_q)
    # Streamed: the LLM runs after the query's spans closed, and still finds its scope.
    "".join(ask(li_index, llm, second_q, streaming=True).response_gen)
    one, two = spec(li_calls, first_q), spec(li_calls, second_q)
    scope = f"index:{li_index.index_id}"
    assert (one["speculative"]["store_answers"], two["speculative"]["store_answers"]) == (0, 1)
    assert one["speculative"]["answer_scope"] == two["speculative"]["answer_scope"] == scope
    held = llm.answer_scopes.get(scope).answers()
    eos = llm.generator.eos_token_ids
    assert held == [tuple(answer_tokens(c["token_ids"], eos)) for c in (one, two)]

    li_calls.clear()
    off = NGramTrieLLM(max_new_tokens=TOKENS, remember_answers=False)
    ask(li_index, off, first_q)
    ask(li_index, off, second_q)
    plain_one, plain_two = spec(li_calls, first_q), spec(li_calls, second_q)
    assert plain_two["speculative"]["store_answers"] == 0
    assert plain_two["speculative"]["answer_scope"] is None
    # Drafts change speed, never the answer: token for token.
    assert [plain_one["token_ids"], plain_two["token_ids"]] == [one["token_ids"],
                                                                two["token_ids"]]
    assert len(off.answer_scopes) == 0


def test_answers_never_cross_to_another_index(li_index, other_index, li_calls):
    first_q, second_q, third_q = ("Who was Horatio Hale?", "What is Pavia Cathedral?",
                                  "Where is Pavia Cathedral?")
    llm = NGramTrieLLM(max_new_tokens=TOKENS)
    ask(li_index, llm, first_q)
    ask(other_index, llm, second_q)
    ask(other_index, llm, third_q)
    one, two, three = (spec(li_calls, q)["speculative"] for q in (first_q, second_q, third_q))
    assert two["store_answers"] == 0  # the other index's first query: nothing crossed
    assert three["store_answers"] == 1  # its own earlier answer only
    assert one["answer_scope"] == f"index:{li_index.index_id}"
    assert two["answer_scope"] == three["answer_scope"] == f"index:{other_index.index_id}"


def test_the_companion_retriever_is_scoped_by_its_index(li_nodes):
    from ngram_trie_rag.retrieval import Passage, Retriever

    passages = [Passage(id=n.node_id, text=n.text, source="wiki") for n in li_nodes[:3]]
    faiss = Retriever.build(passages)
    scope = NGramTrieRetriever(faiss).answer_scope
    assert scope.startswith("index:VectorIndex#")
    assert NGramTrieRetriever(Retriever(faiss.index, top_n=1)).answer_scope == scope
    other = Retriever.build(passages[:2], embedder=faiss.embedder)
    assert NGramTrieRetriever(other).answer_scope != scope


def test_a_pinned_store_shares_answers_across_indexes(li_index, other_index, li_calls):
    first_q, second_q = "Who was Horatio Hale?", "What is Pavia Cathedral?"
    shared = AnswerStore()
    llm = NGramTrieLLM(max_new_tokens=TOKENS, answer_store=shared)
    ask(li_index, llm, first_q)
    ask(other_index, llm, second_q)
    two = spec(li_calls, second_q)["speculative"]
    assert two["store_answers"] == 1 and two["answer_scope"] == "shared"
    assert len(shared) == 2 and len(llm.answer_scopes) == 0


def test_a_named_scope_and_calls_without_a_scope():
    llm = NGramTrieLLM(max_new_tokens=SHORT)
    bare = [llm.complete(COLORS) for _ in range(2)]
    assert [r.additional_kwargs["speculative"]["answer_scope"] for r in bare] == [None, None]
    given = llm.complete(COLORS, documents=["Red, green and blue are colors."])
    assert given.additional_kwargs["speculative"]["answer_scope"] is None
    assert len(llm.answer_scopes) == 0

    with named("colors"):
        llm.complete(COLORS)
        again = llm.complete(ANIMALS)
        streamed = list(llm.stream_complete(COLORS))
    assert again.additional_kwargs["speculative"]["store_answers"] == 1
    assert again.additional_kwargs["speculative"]["answer_scope"] == "colors"
    assert streamed[-1].additional_kwargs["speculative"]["store_answers"] == 2


def test_scopes_are_bounded_least_recently_used_first():
    llm = NGramTrieLLM(max_new_tokens=SHORT, max_answer_scopes=2, max_tokens_per_scope=100)
    for scope in ("a", "b", "c"):
        with named(scope):
            llm.complete(COLORS)
    assert llm.answer_scopes.scopes() == ["b", "c"]  # "a" was dropped whole
    with named("a"):
        dropped = llm.complete(ANIMALS)
    assert dropped.additional_kwargs["speculative"]["store_answers"] == 0
    assert llm.answer_scopes.scopes() == ["c", "a"]
    with named("c"):
        kept = llm.complete(ANIMALS)
    assert kept.additional_kwargs["speculative"]["store_answers"] == 1
    assert llm.answer_scopes.get("c").max_tokens == 100


async def test_concurrent_queries_of_two_indexes_stay_apart(li_index, other_index, li_calls):
    llm = NGramTrieLLM(max_new_tokens=SHORT)
    asked = [(li_index, "Who was Evan Morris?"), (li_index, "Who was Horatio Hale?"),
             (other_index, "What is Pavia Cathedral?"), (other_index, "Where is Pavia?")]
    await asyncio.gather(*(index.as_query_engine(llm=llm, similarity_top_k=1).aquery(q)
                           for index, q in asked))
    eos = llm.generator.eos_token_ids
    for index in (li_index, other_index):
        own = {tuple(answer_tokens(spec(li_calls, q)["token_ids"], eos))
               for i, q in asked if i is index}
        assert set(llm.answer_scopes.get(f"index:{index.index_id}").answers()) == own
    assert registry_size() == 0


def test_a_seeded_sample_skips_its_scope():
    llm = NGramTrieLLM(max_new_tokens=SHORT)
    with named("s"):
        first = llm.complete(COLORS, temperature=0.8, seed=3, num_draft=8)
        again = llm.complete(COLORS, temperature=0.8, seed=3, num_draft=8)
        unseeded = llm.complete(COLORS, temperature=0.8)
    assert first.additional_kwargs["speculative"]["answer_scope"] is None
    assert again.text == first.text
    assert unseeded.additional_kwargs["speculative"]["answer_scope"] == "s"


# The whole table of bad settings runs against the shared settings in
# tests/test_wrapper_settings.py; here, that this class checks with them.
@pytest.mark.parametrize(("settings", "error", "message"), [
    ({"remember_answers": "yes"}, TypeError, "remember_answers must be True or False"),
    ({"backend": "vllm", "max_answer_scopes": 4}, ValueError,
     "max_answer_scopes cannot be used where calls run on 'vllm'"),
])
def test_bad_answer_settings_fail_clearly(settings, error, message):
    with pytest.raises(error, match=message):
        NGramTrieLLM(**settings)


def test_a_bad_scope_name_fails_clearly_and_vllm_keeps_no_answers():
    llm = NGramTrieLLM(max_new_tokens=SHORT)
    with named(42), pytest.raises(TypeError, match=r"instrument_tags\['ngram_trie_scope'\]"):
        llm.complete(COLORS)
    with named(""), pytest.raises(ValueError, match="must not be empty"):
        llm.complete(COLORS)
    server = NGramTrieLLM(base_url=URL, model_name="m")  # the default: silently unused
    with named("s"):
        call = server._call(COLORS, {})
    assert call.request.options.answer_store is None and call.source.answer_scope is None
