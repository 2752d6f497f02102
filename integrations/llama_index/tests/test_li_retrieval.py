"""The retriever and reranker adapters over ngram_trie_rag.retrieval, alone and in a
RetrieverQueryEngine (the trie is built from the reranked nodes)."""

from __future__ import annotations

import pytest
from li_support import llm_text
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode

from llama_index.llms.ngram_trie import NGramTrieRerank, NGramTrieRetriever, registry_size

retrieval = pytest.importorskip("ngram_trie_rag.retrieval")

QUESTION = "Who was Eileen Herlie?"


@pytest.fixture(scope="module")
def passage_retriever(li_nodes):
    passages = [retrieval.Passage(id=n.node_id, text=n.text, source="wiki.jsonl")
                for n in li_nodes]
    return retrieval.Retriever.build(passages, top_n=4)


@pytest.fixture(scope="module")
def llm_reranker(li_llm):
    gen = li_llm.generator
    # Short passages keep the scoring passes cheap; the ranking logic is the same.
    return retrieval.LLMReranker(gen.model, gen.tokenizer, max_passage_tokens=64)


async def test_retriever_keeps_ids_texts_and_scores(passage_retriever):
    expected = passage_retriever.retrieve(QUESTION, top_n=3)
    adapter = NGramTrieRetriever(passage_retriever, top_n=3)
    nodes = adapter.retrieve(QUESTION)
    assert [n.node.node_id for n in nodes] == [p.id for p in expected]
    assert [n.node.get_content() for n in nodes] == [p.text for p in expected]
    assert [n.score for n in nodes] == pytest.approx([p.score for p in expected])
    # The source is shown to the LLM like a file name; nothing else is.
    assert nodes[0].node.get_content(MetadataMode.LLM).startswith("source: wiki.jsonl\n")
    assert [n.node.node_id for n in await adapter.aretrieve(QUESTION)] == [p.id for p in expected]


async def test_rerank_keeps_the_reranker_order_and_top_n(li_index, llm_reranker):
    retrieved = li_index.as_retriever(similarity_top_k=4).retrieve(QUESTION)
    passages = [retrieval.Passage(id=str(i), text=n.node.get_content(), source="x", score=n.score)
                for i, n in enumerate(retrieved)]
    expected = llm_reranker.rerank(QUESTION, passages, top_n=2)
    reranked = NGramTrieRerank(llm_reranker, top_n=2).postprocess_nodes(
        retrieved, query_str=QUESTION)
    assert [n.node for n in reranked] == [retrieved[int(p.id)].node for p in expected]
    assert [n.score for n in reranked] == pytest.approx([p.score for p in expected])
    again = await NGramTrieRerank(llm_reranker, top_n=2).apostprocess_nodes(
        retrieved, query_str=QUESTION)
    assert [n.node.node_id for n in again] == [n.node.node_id for n in reranked]


def test_query_engine_drafts_from_the_reranked_nodes(passage_retriever, llm_reranker, li_llm,
                                                     li_plain_llm, li_calls):
    def build(llm):
        return RetrieverQueryEngine.from_args(
            NGramTrieRetriever(passage_retriever), llm=llm,
            node_postprocessors=[NGramTrieRerank(llm_reranker, top_n=2)])

    response = build(li_llm).query(QUESTION)
    assert len(response.source_nodes) == 2  # 4 retrieved, 2 kept
    [call] = li_calls.about(QUESTION)
    assert call["draft_origin"] == "retrieved_nodes"
    assert call["draft_texts"] == llm_text(response.source_nodes)
    assert registry_size() == 0
    assert response.response == build(li_plain_llm).query(QUESTION).response
