"""``NGramTrieRetriever`` over the project's FAISS retriever: LangChain's standard retriever
suite, and a RAG chain whose trie is built from the passages it returned (reranked by the
LLM reranker)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import RunnablePassthrough
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_ngram_trie import ChatNGramTrie, NGramTrieRetriever, document_registry


class TestNGramTrieRetrieverStandard(RetrieversIntegrationTests):
    faiss: Any = None

    @pytest.fixture(autouse=True)
    def _faiss(self, faiss_retriever) -> None:
        type(self).faiss = faiss_retriever

    @property
    def retriever_constructor(self) -> type[NGramTrieRetriever]:
        return NGramTrieRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"retriever": self.faiss}

    @property
    def retriever_query_example(self) -> str:
        return "Where was Socrates born?"


def test_passages_keep_id_source_and_score(faiss_retriever):
    query = "What does NASA stand for?"
    docs = NGramTrieRetriever(retriever=faiss_retriever, k=2).invoke(query)
    assert [d.id for d in docs] == [p.id for p in faiss_retriever.retrieve(query, top_n=2)]
    assert all(d.metadata["source"] == "hagrid" and "score" in d.metadata for d in docs)


def test_chain_drafts_from_the_reranked_passages(hagrid, gen, fmt, rag_prompt, recorder,
                                                 held_before):
    from ngram_trie_rag.retrieval import LLMReranker, Passage, Retriever

    passages, questions = hagrid
    reranking = Retriever.build(
        [Passage(id=d.id, text=d.page_content, source="hagrid") for d in passages],
        reranker=LLMReranker(gen.model, gen.tokenizer), top_k=5, top_n=2)
    retriever = NGramTrieRetriever(retriever=reranking)
    chain = ({"context": retriever | fmt, "question": RunnablePassthrough()}
             | rag_prompt | ChatNGramTrie(max_tokens=24) | StrOutputParser())
    question = questions[14]
    assert chain.invoke(question, config={"callbacks": [recorder]})
    drafted = [d["id"] for d in recorder.by_question[question]["speculative"]["documents"]]
    assert drafted == [p.id for p in reranking.retrieve(question)]
    assert document_registry().size == held_before
