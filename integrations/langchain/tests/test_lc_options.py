"""Per-call options on the chat model: explicit documents (which beat retrieved ones),
stop strings, token limits, sampling, input checks, and early stream exits that must
release the model."""

from __future__ import annotations

import asyncio
import threading

import pytest
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnablePassthrough

from langchain_ngram_trie import ChatNGramTrie, document_registry

FACT = ("Socrates was born in Alopece, a deme of Athens, around 470 BC. He was the son of "
        "Sophroniscus, a stonemason, and Phaenarete, a midwife.")
QUESTION = [HumanMessage(f"{FACT}\n\nWhere was Socrates born? Answer in one sentence.")]


@pytest.fixture(scope="module")
def llm() -> ChatNGramTrie:
    return ChatNGramTrie(max_tokens=24)


def spec(message) -> dict:
    return message.response_metadata["speculative"]


def test_bound_documents_beat_retrieved_ones_and_keep_the_answer(llm, vector_store, fmt,
                                                                  rag_prompt, hagrid,
                                                                  held_before):
    question = hagrid[1][9]
    own = [Document(page_content=FACT, id="fact"), "Alopece was a deme of ancient Athens."]
    retriever = vector_store.as_retriever(search_kwargs={"k": 2})
    head = {"context": retriever | fmt, "question": RunnablePassthrough()} | rag_prompt
    bound = (head | llm.bind(documents=own)).invoke(question)
    auto = (head | llm).invoke(question)
    assert spec(bound)["documents_from"] == "argument"
    assert [d["id"] for d in spec(bound)["documents"]] == ["fact", None]
    assert spec(auto)["documents_from"] == "retriever"
    assert bound.content == auto.content  # drafting changes speed, never the answer
    assert spec((head | llm.bind(documents=[])).invoke(question))["draft_source"] == "prompt"
    off = ChatNGramTrie(max_tokens=4, use_retrieved_documents=False)
    assert spec((head | off).invoke(question))["draft_source"] == "prompt"
    assert document_registry().size == held_before


def test_blank_and_repeated_documents_are_skipped(llm):
    """Passed on as given (the response names all four) and settled by the core, which
    drafts from each distinct non-blank text once; with nothing left, from the prompt."""
    message = llm.invoke(QUESTION, documents=["", "  ", FACT, Document(page_content=FACT)],
                         max_tokens=4)
    assert spec(message)["num_documents"] == 1 and spec(message)["draft_source"] == "documents"
    assert [d["preview"] for d in spec(message)["documents"]] == ["", "  ", FACT[:80], FACT[:80]]
    blank = llm.invoke(QUESTION, documents=[Document(page_content=" ")], max_tokens=4)
    assert spec(blank)["documents_from"] == "argument"
    assert spec(blank)["draft_source"] == "prompt" and spec(blank)["num_documents"] == 0
    assert blank.content == message.content  # drafting changes speed, never the answer


def test_stop_and_max_tokens(llm):
    full = llm.invoke(QUESTION)
    word = full.content.split()[2]
    stopped = llm.invoke(QUESTION, stop=[word])
    assert stopped.response_metadata["finish_reason"] == "stop"
    assert full.content.startswith(stopped.content) and word not in stopped.content
    short = llm.invoke(QUESTION, max_tokens=3)
    assert short.usage_metadata["output_tokens"] == 3
    assert short.response_metadata["finish_reason"] == "length"
    assert ChatNGramTrie(max_tokens=24, stop=[word]).invoke(QUESTION).content == stopped.content


def test_sampling_is_seeded_and_honours_top_p_top_k(llm):
    # A pinned draft size makes the random draws, hence the sample, repeatable (an adaptive
    # size follows measured latencies, which vary from run to run).
    options = {"temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 11, "max_tokens": 12,
               "num_draft": 8}
    first = llm.invoke(QUESTION, **options)
    assert llm.invoke(QUESTION, **options).content == first.content
    assert first.usage_metadata["output_tokens"] <= 12


def test_bad_inputs_raise(llm):
    with pytest.raises(TypeError, match="not a string: wrap it"):
        llm.invoke(QUESTION, documents=FACT)
    with pytest.raises(TypeError, match="document 1 must be a string or a list of token ids"):
        llm.invoke(QUESTION, documents=[FACT, 42])
    with pytest.raises(TypeError, match="unsupported keyword"):
        llm.invoke(QUESTION, max_new_tokens=3)
    image = HumanMessage(content=[{"type": "text", "text": "What is this?"},
                                  {"type": "image_url", "image_url": {"url": "x.png"}}])
    with pytest.raises(ValueError, match="text only"):
        llm.invoke([image])
    with pytest.raises(ValueError):
        ChatNGramTrie(n=3, prefix_len=3)


def _finishes(fn, seconds: float = 120.0) -> bool:
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()


def test_leaving_a_stream_early_releases_the_model(llm):
    for chunk in llm.stream(QUESTION):
        if chunk.content:
            break  # the generator is closed here, with the model's lock held until now
    assert _finishes(lambda: llm.invoke(QUESTION, max_tokens=2))


async def test_leaving_an_async_stream_early_releases_the_model(llm):
    stream = llm.astream(QUESTION)
    async for chunk in stream:
        if chunk.content:
            break
    await stream.aclose()
    message = await asyncio.wait_for(llm.ainvoke(QUESTION, max_tokens=2), timeout=120)
    assert message.usage_metadata["output_tokens"] == 2


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"temperature": float("nan")}, ValueError, "temperature must be a finite number, got nan"),
    ({"max_tokens": 3.7}, TypeError, "max_tokens must be an integer, got 3.7"),
    ({"max_tokens": True}, TypeError, "max_tokens must be an integer, got True"),
    ({"top_p": 2.0}, ValueError, "top_p must be <= 1.0"),
    ({"seed": "7"}, TypeError, "seed must be an integer"),
    ({"documents": [b"Error E2"]}, TypeError, "document 0 is bytes.*decode"),
    ({"documents": b"Error E2"}, TypeError, "documents are bytes.*decode"),
])
def test_bad_numbers_and_bytes_are_clear_errors(llm, kwargs, error, message):
    """Refused by name before the model runs, never as an error from inside torch."""
    with pytest.raises(error, match=message):
        llm.invoke(QUESTION, **kwargs)


def test_numeric_fields_refuse_bools_and_nan():
    with pytest.raises(ValueError, match="max_tokens must be a number, got True"):
        ChatNGramTrie(max_tokens=True)
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):  # the field's name
        ChatNGramTrie(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        ChatNGramTrie(temperature=float("nan"))


def test_method_and_its_deprecated_spelling_draft_method(llm):
    plain = llm.invoke(QUESTION, method="none", max_tokens=6)
    assert spec(plain)["method"] == "none"
    deprecated = "'draft_method' is deprecated; use 'method'"
    with pytest.warns(DeprecationWarning, match=deprecated):
        old = llm.invoke(QUESTION, draft_method="none", max_tokens=6)
    with pytest.warns(DeprecationWarning, match=deprecated):
        bound = llm.bind(draft_method="none").invoke(QUESTION, max_tokens=6)
    assert spec(old)["method"] == spec(bound)["method"] == "none"
    assert old.content == bound.content == plain.content
    with pytest.warns(DeprecationWarning, match=deprecated):
        chain = ChatNGramTrie(max_tokens=6, draft_method="chain")
    assert chain.method == "chain" and "draft_method" not in chain.model_fields_set
    assert spec(chain.invoke(QUESTION))["method"] == "chain"
    assert spec(ChatNGramTrie(max_tokens=6, method="chain").invoke(QUESTION))["method"] == "chain"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="name one setting"):
        ChatNGramTrie(method="trie", draft_method="chain")
    with pytest.raises(ValueError, match="unknown draft method 'beam'"):
        llm.invoke(QUESTION, method="beam")
