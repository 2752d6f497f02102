"""``NGramTrieLLM`` in a string-prompt RAG chain: per-input documents under ``batch`` and
``abatch`` (``BaseLLM``'s own batch would give every input the first input's run), and
answers equal to plain greedy decoding of the same prompt string."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnablePassthrough

from langchain_ngram_trie import NGramTrieLLM, document_registry

TOKENS = 24
PROMPT = PromptTemplate.from_template(
    "Context:\n{context}\n\nQuestion: {question}\nAnswer in one sentence:")


class LLMRecorder(BaseCallbackHandler):
    """Prompt text -> generation_info of the completion made for it."""

    def __init__(self) -> None:
        self._prompt: dict[Any, str] = {}
        self.by_prompt: dict[str, dict[str, Any]] = {}

    def on_llm_start(self, serialized: Any, prompts: list[str], *, run_id: Any,
                     **kwargs: Any) -> None:
        self._prompt[run_id] = prompts[0]

    def on_llm_end(self, response: Any, *, run_id: Any, **kwargs: Any) -> None:
        self.by_prompt[self._prompt.pop(run_id)] = response.generations[0][0].generation_info


@pytest.fixture(scope="module")
def retriever(vector_store):
    return vector_store.as_retriever(search_kwargs={"k": 2})


@pytest.fixture(scope="module")
def chain(retriever, fmt):
    return ({"context": retriever | fmt, "question": RunnablePassthrough()}
            | PROMPT | NGramTrieLLM(max_tokens=TOKENS))


def prompt_text(retriever, fmt, question: str) -> str:
    return PROMPT.format(context=fmt(retriever.invoke(question)), question=question)


def check_own_documents(recorder: LLMRecorder, retriever, fmt, questions: list[str]) -> None:
    for question in questions:
        info = recorder.by_prompt[prompt_text(retriever, fmt, question)]
        drafted = [d["id"] for d in info["speculative"]["documents"]]
        assert drafted == [d.id for d in retriever.invoke(question)]
        assert info["speculative"]["documents_from"] == "retriever"


def test_batch_each_input_its_own_documents_and_greedy_text(held_before, chain, retriever, fmt, gen,
                                                            greedy_text, hagrid):
    questions = hagrid[1][6:10]
    recorder = LLMRecorder()
    answers = chain.batch(questions, config={"callbacks": [recorder],
                                             "max_concurrency": 2})
    check_own_documents(recorder, retriever, fmt, questions)
    for question, answer in zip(questions[:2], answers[:2], strict=True):
        ids = gen.tokenizer(prompt_text(retriever, fmt, question))["input_ids"]
        assert answer == greedy_text(list(ids), TOKENS)
    assert document_registry().size == held_before


async def test_abatch_and_astream(held_before, chain, retriever, fmt, hagrid):
    questions = hagrid[1][10:13]
    recorder = LLMRecorder()
    answers = await chain.abatch(questions, config={"callbacks": [recorder]})
    check_own_documents(recorder, retriever, fmt, questions)
    streamed = "".join([chunk async for chunk in chain.astream(questions[0])])
    assert streamed == answers[0]
    assert document_registry().size == held_before


def test_direct_batch_is_per_input_and_usage_is_reported(hagrid):
    llm = NGramTrieLLM(max_tokens=8)
    texts = ["The capital of France is", "Water boils at"]
    result = llm.generate(texts, documents=["Paris is the capital of France."])
    infos = [g[0].generation_info for g in result.generations]
    assert [i["speculative"]["documents_from"] for i in infos] == ["argument", "argument"]
    usage = result.llm_output["token_usage"]
    assert usage["output_tokens"] == sum(i["usage"]["output_tokens"] for i in infos)
    assert llm.batch(texts) == [g[0].text for g in result.generations]
