"""A reranking retriever wrapping the base one: the trie is built from the reranked top-n
only, not from the candidates the reranker chose from."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough

from langchain_ngram_trie import ChatNGramTrie, document_registry

CANDIDATES = 5
TOP_N = 2
TOKENS = 40
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


class SentenceRerankRetriever(BaseRetriever):
    """Re-scores the base retriever's candidates by their best-matching sentence (MiniLM
    cosine to the query) and keeps the top ``top_n``: passage-level embeddings blur a
    passage's one relevant sentence, sentence-level scores do not."""

    base: BaseRetriever
    embeddings: Any
    top_n: int = TOP_N

    def _score(self, query: str, doc: Document) -> float:
        sentences = [s for s in _SENTENCE.split(doc.page_content) if s.strip()]
        vectors = np.asarray(self.embeddings.embed_documents(sentences))
        return float((vectors @ np.asarray(self.embeddings.embed_query(query))).max())

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        candidates = self.base.invoke(query, config={"callbacks": run_manager.get_child()})
        scored = sorted(((self._score(query, d), i) for i, d in enumerate(candidates)),
                        reverse=True)
        return [candidates[i] for _, i in scored[: self.top_n]]


@pytest.fixture(scope="module")
def base(vector_store):
    return vector_store.as_retriever(search_kwargs={"k": CANDIDATES})


@pytest.fixture(scope="module")
def reranker(base, embeddings):
    return SentenceRerankRetriever(base=base, embeddings=embeddings)


def chain_with(retriever, fmt, prompt, llm):
    return ({"context": retriever | fmt, "question": RunnablePassthrough()}
            | prompt | llm | StrOutputParser())


def test_trie_is_built_from_the_reranked_top_n(base, reranker, fmt, rag_prompt, recorder,
                                               plain_greedy_chat, hagrid, held_before):
    questions = [hagrid[1][8], hagrid[1][11]]  # where reranking changes the top-2
    chain = chain_with(reranker, fmt, rag_prompt, ChatNGramTrie(max_tokens=TOKENS))
    answers = chain.batch(questions, config={"callbacks": [recorder]})

    changed = 0
    for question in questions:
        spec = recorder.by_question[question]["speculative"]
        drafted = [d["id"] for d in spec["documents"]]
        reranked = [d.id for d in reranker.invoke(question)]
        candidates = [d.id for d in base.invoke(question)]
        assert drafted == reranked and len(drafted) == TOP_N
        assert len(candidates) == CANDIDATES
        changed += reranked != candidates[:TOP_N]
    assert changed, "pick questions where reranking changes the top-n"

    reference = chain_with(reranker, fmt, rag_prompt, plain_greedy_chat(TOKENS))
    assert answers[0] == reference.invoke(questions[0])
    assert document_registry().size == held_before
