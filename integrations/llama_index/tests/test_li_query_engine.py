"""Engines over a real VectorStoreIndex: the trie is built from exactly the nodes the
synthesizer received, for the current query only, and answers equal plain greedy ones."""

from __future__ import annotations

import asyncio

from li_support import PlainGreedyLLM, llm_text, title
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from llama_index.llms.ngram_trie import NGramTrieLLM, NGramTrieRerank, registry_size

TOP_K = 2


def engine(index, llm, **kwargs):
    return index.as_query_engine(llm=llm, **{"similarity_top_k": TOP_K, **kwargs})


def assert_drafted_from(call: dict, nodes: list[NodeWithScore]) -> None:
    assert call["draft_origin"] == "retrieved_nodes"
    assert call["draft_node_ids"] == [n.node.node_id for n in nodes]
    assert call["draft_texts"] == llm_text(nodes)
    assert call["speculative"]["num_documents"] == len(nodes)


def test_query(li_index, li_llm, li_plain_llm, li_calls):
    question = "Who was Evan Morris?"
    response = engine(li_index, li_llm).query(question)
    assert registry_size() == 0
    assert "0" in [n.node.node_id for n in response.source_nodes]  # his passage
    [call] = li_calls.about(question)
    assert_drafted_from(call, response.source_nodes)
    assert response.response == engine(li_index, li_plain_llm).query(question).response


def test_streaming_query(li_index, li_llm, li_plain_llm, li_calls):
    question = "Who was Horatio Hale?"
    response = engine(li_index, li_llm, streaming=True).query(question)
    # The query returned and its spans closed before the answer is generated: the nodes
    # travel with the response's generator, not in the registry.
    assert registry_size() == 0
    text = "".join(response.response_gen)
    [call] = li_calls.about(question)
    assert_drafted_from(call, response.source_nodes)
    assert text == engine(li_index, li_plain_llm).query(question).response


async def test_10_concurrent_aqueries(li_index, li_nodes, li_calls):
    # Short answers from one node each: 20 generations (10 + their references) stay cheap.
    llm = NGramTrieLLM(max_new_tokens=8)
    plain = PlainGreedyLLM(llm.generator, llm.metadata, 8)
    titles = list(dict.fromkeys(title(n) for n in li_nodes))[:10]
    questions = [f"What is {t}?" for t in titles]
    responses = await asyncio.gather(
        *(engine(li_index, llm, similarity_top_k=1).aquery(q) for q in questions))
    assert registry_size() == 0
    drafted = set()
    for question, response in zip(questions, responses, strict=True):
        [call] = li_calls.about(question)
        assert_drafted_from(call, response.source_nodes)
        drafted.add(tuple(call["draft_node_ids"]))
        reference = engine(li_index, plain, similarity_top_k=1).query(question)
        assert response.response == reference.response
    assert len(drafted) > 5  # different queries drafted from different nodes


def test_context_chat_engine(li_index, li_llm, li_plain_llm, li_calls):
    spec = li_index.as_chat_engine(chat_mode="context", llm=li_llm, similarity_top_k=TOP_K)
    plain = li_index.as_chat_engine(chat_mode="context", llm=li_plain_llm,
                                    similarity_top_k=TOP_K)
    first = "What is Pavia Cathedral?"
    response = spec.chat(first)
    [call] = li_calls.raws()
    assert_drafted_from(call, response.source_nodes)
    assert response.response == plain.chat(first).response
    assert registry_size() == 0

    li_calls.clear()
    second = "Who was Ian Hummer?"
    streamed = spec.stream_chat(second)
    text = "".join(streamed.response_gen)
    [call] = li_calls.raws()
    assert_drafted_from(call, streamed.source_nodes)
    assert text == plain.chat(second).response


async def test_condense_plus_context_chat_engine(li_index, li_llm, li_plain_llm, li_calls):
    kwargs = {"chat_mode": "condense_plus_context", "similarity_top_k": TOP_K}
    spec = li_index.as_chat_engine(llm=li_llm, **kwargs)
    plain = li_index.as_chat_engine(llm=li_plain_llm, **kwargs)
    first = "What is Horse Mesa Dam?"
    response = await spec.achat(first)
    [call] = li_calls.raws()
    assert_drafted_from(call, response.source_nodes)
    assert response.response == (await plain.achat(first)).response

    li_calls.clear()
    second = "When was it completed?"
    streamed = await spec.astream_chat(second)
    text = "".join([token async for token in streamed.async_response_gen()])
    condense, answer = li_calls.raws()
    assert condense["draft_origin"] == "prompt"  # rewriting the question: no retrieval yet
    assert_drafted_from(answer, streamed.source_nodes)
    assert text == (await plain.achat(second)).response
    assert registry_size() == 0


def test_reranking_postprocessor(li_index, li_llm, li_plain_llm, li_calls):
    from ngram_trie_rag.retrieval import LLMReranker

    gen = li_llm.generator
    rerank = NGramTrieRerank(LLMReranker(gen.model, gen.tokenizer, max_passage_tokens=64),
                            top_n=2)
    question = "Which airborne corps was formed by the Soviet Union?"
    retrieved = li_index.as_retriever(similarity_top_k=4).retrieve(question)
    response = li_index.as_query_engine(
        llm=li_llm, similarity_top_k=4, node_postprocessors=[rerank]).query(question)
    assert len(response.source_nodes) == 2
    assert {n.node.node_id for n in response.source_nodes} <= {n.node.node_id for n in retrieved}
    [call] = li_calls.about(question)
    assert_drafted_from(call, response.source_nodes)  # the reranked 2, not the retrieved 4
    plain = li_index.as_query_engine(llm=li_plain_llm, similarity_top_k=4,
                                     node_postprocessors=[rerank])
    assert response.response == plain.query(question).response


class _KeepLast(BaseNodePostprocessor):
    """A postprocessor that visibly changes the list: keeps the last node only."""

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        return nodes[-1:]


def test_pipeline_without_synthesizer_drafts_from_postprocessed_nodes(li_index, li_llm):
    retriever = li_index.as_retriever(similarity_top_k=3)
    question = "What is Mount Gabi?"

    @get_dispatcher(__name__).span
    def answer(query: str):
        nodes = _KeepLast().postprocess_nodes(retriever.retrieve(query), query_str=query)
        context = "\n".join(n.node.get_content() for n in nodes)
        return nodes, li_llm.complete(f"{context}\n\n{query}", max_new_tokens=8)

    nodes, response = answer(question)
    assert len(nodes) == 1
    assert response.raw["draft_node_ids"] == [nodes[0].node.node_id]
    assert response.raw["draft_origin"] == "retrieved_nodes"
    assert registry_size() == 0
