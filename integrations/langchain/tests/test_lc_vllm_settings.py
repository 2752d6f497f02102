"""Choosing where calls run (local engine, vLLM server, vLLM in-process): contradicting or
foreign settings fail at construction, nothing is loaded or contacted before a call, and a
call reaches vLLM's backend as the core request it should be.

vLLM cannot run here, so what the vLLM backend receives is checked through a recording
client behind the core's ``VLLMBackend``; the vLLM paths themselves run against a real
server and engine in tests/with_vllm.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from ngram_trie_rag.backends import VLLMBackend
from ngram_trie_rag.decoding.options import GenerationOptions
from ngram_trie_rag.serving.openai_http import Delta

from langchain_ngram_trie import ChatNGramTrie, NGramTrieLLM

URL = "http://127.0.0.1:8000/v1"
QUESTION = [HumanMessage("Where was Socrates born?")]
FACT = "Socrates was born in Alopece."
ACCEPTANCE = {"num_spec_steps": 3, "num_draft_tokens": 9, "num_accepted_draft_tokens": 5}


@pytest.mark.parametrize("cls", [ChatNGramTrie, NGramTrieLLM])
def test_base_url_and_in_process_vllm_exclude_each_other(cls) -> None:
    with pytest.raises(ValueError, match="base_url and backend='vllm' exclude each other"):
        cls(base_url=URL, backend="vllm")
    with pytest.raises(ValueError, match="base_url and backend='local' exclude each other"):
        cls(base_url=URL, backend="local")


@pytest.mark.parametrize("cls", [ChatNGramTrie, NGramTrieLLM])
def test_an_unknown_backend_is_refused(cls) -> None:
    with pytest.raises(ValueError, match="unknown backend 'sglang'"):
        cls(backend="sglang")


def test_settings_another_place_reads_are_refused() -> None:
    with pytest.raises(ValueError, match=r"n, num_draft cannot be used .* 'vllm-server'"):
        ChatNGramTrie(base_url=URL, n=9, num_draft=8)
    with pytest.raises(ValueError, match=r"device cannot be used .* 'vllm'"):
        ChatNGramTrie(backend="vllm", device="cpu")
    with pytest.raises(ValueError, match=r"vllm_engine_args cannot be used .* 'local'"):
        ChatNGramTrie(vllm_engine_args={"dtype": "float32"})
    with pytest.raises(ValueError, match=r"num_speculative_tokens cannot be used .* server"):
        NGramTrieLLM(base_url=URL, num_speculative_tokens=4)
    with pytest.raises(ValueError, match=r"method, repetition_stop cannot be used .* 'vllm'"):
        NGramTrieLLM(backend="vllm", method="chain", repetition_stop=4)
    with pytest.warns(DeprecationWarning, match="'draft_method' is deprecated"), \
            pytest.raises(ValueError, match=r"method cannot be used .* 'vllm-server'"):
        ChatNGramTrie(base_url=URL, draft_method="none")
    assert ChatNGramTrie(api_key="test").runs_on == "local"  # as LangChain's standard tests pass


def test_vllm_settings_build_without_loading_or_contacting_anything() -> None:
    server = ChatNGramTrie(base_url=URL, model="smollm2", api_key="secret", max_tokens=8)
    assert server.runs_on == "vllm-server"
    assert server._identifying_params == {
        "model": "smollm2", "base_url": URL, "max_tokens": 8, "temperature": 0.0,
        "top_p": 1.0, "top_k": 0, "seed": None}
    assert "secret" not in repr(server)  # a SecretStr
    assert server._get_ls_params()["ls_model_name"] == "smollm2"
    assert server.backend_settings().api_key == "secret"
    engine = NGramTrieLLM(backend="vllm", vllm_engine_args={"dtype": "float32"})
    assert engine.runs_on == "vllm"
    assert engine._identifying_params["vllm_engine_args"] == {"dtype": "float32"}
    assert engine._backend is None  # made, and the engine started, on the first call
    assert ChatNGramTrie().runs_on == "local"


class RecordingClient:
    """A vLLM client that answers ``parts`` to every request and records what each one
    carried (prompt, documents, options), in the shape ``VLLMBackend`` hands its clients."""

    name = "vllm-server"
    model_name = "served-model"
    context_window = None

    def __init__(self, *parts: Delta) -> None:
        self.parts = parts
        self.requests: list[tuple[Any, list[str] | None, GenerationOptions]] = []

    def stream(self, prompt: Any, documents: list[str] | None,
               options: GenerationOptions) -> Iterator[Delta]:
        self.requests.append((prompt, documents, options))
        yield from self.parts

    async def astream(self, prompt: Any, documents: list[str] | None,
                      options: GenerationOptions) -> AsyncIterator[Delta]:
        for part in self.stream(prompt, documents, options):
            yield part

    def complete(self, prompt: Any, documents: list[str] | None,
                 options: GenerationOptions) -> Delta:
        *_, last = self.stream(prompt, documents, options)
        return Delta("".join(p.text for p in self.parts), last.finish_reason,
                     last.prompt_tokens, last.completion_tokens, last.speculative)

    async def acomplete(self, prompt: Any, documents: list[str] | None,
                        options: GenerationOptions) -> Delta:
        return self.complete(prompt, documents, options)


def on_recorded_vllm(llm: Any, *parts: Delta) -> RecordingClient:
    client = RecordingClient(*parts)
    llm._backend = VLLMBackend(client)
    return client


ANSWER = (Delta("In Alopece"), Delta(".", "eos", 21, 4, ACCEPTANCE))


def test_a_chat_call_reaches_vllm_as_its_options_documents_and_messages() -> None:
    llm = ChatNGramTrie(base_url=URL, model="served-model", max_tokens=12, top_k=5)
    client = on_recorded_vllm(llm, *ANSWER)
    message = llm.invoke(QUESTION, temperature=0.5, top_p=0.9, seed=7, stop=["\n"],
                         documents=[FACT, FACT, " "])
    [(prompt, documents, options)] = client.requests
    assert prompt == [{"role": "user", "content": "Where was Socrates born?"}]
    assert documents == [FACT]  # blank and repeated documents are not sent
    assert options == GenerationOptions(max_new_tokens=12, temperature=0.5, top_p=0.9,
                                        top_k=5, stop=("\n",), seed=7)
    assert message.content == "In Alopece."
    assert message.usage_metadata == {"input_tokens": 21, "output_tokens": 4,
                                      "total_tokens": 25}
    speculative = message.response_metadata.pop("speculative")
    assert message.response_metadata == {"model_name": "served-model",
                                         "finish_reason": "eos"}
    described = speculative.pop("documents")  # as passed; the core drafts from one
    assert [d["preview"] for d in described] == [FACT, FACT, " "]
    assert all(d["id"] is None for d in described)
    assert speculative == {"backend": "vllm-server", "draft_source": "documents",
                           "num_documents": 1, "acceptance": ACCEPTANCE,
                           "documents_from": "argument", "answer_scope": None}
    chunks = list(llm.stream(QUESTION))
    assert [c.content for c in chunks] == ["In Alopece", ".", ""]
    assert chunks[-1].response_metadata["speculative"]["draft_source"] == "prompt"
    assert client.requests[-1][1] is None  # no documents: vLLM drafts from the prompt


async def test_a_completion_reaches_vllm_the_same_way_async() -> None:
    llm = NGramTrieLLM(base_url=URL, model="served-model", max_tokens=12)
    client = on_recorded_vllm(llm, *ANSWER)
    assert await llm.abatch(["one", "two"]) == ["In Alopece."] * 2
    assert sorted(prompt for prompt, _, _ in client.requests) == ["one", "two"]
    chunks = [chunk async for chunk in llm.astream("three", documents=[FACT])]
    assert "".join(chunks) == "In Alopece."
    assert client.requests[-1][1:] == ([FACT], GenerationOptions(max_new_tokens=12))


@tool
def get_weather(city: str) -> str:
    """The weather in ``city``."""
    return "sunny"


def test_a_tool_reply_from_vllm_is_parsed_once_into_calls() -> None:
    llm = ChatNGramTrie(base_url=URL, model="served-model")
    reply = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
    client = on_recorded_vllm(llm, Delta(reply, "eos", 30, 20, None))
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    message = bound.invoke("Weather in Paris?")
    assert client.requests[0][2].grammar is not None  # sent as vLLM's structured outputs
    assert message.content == ""
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    full = None
    for chunk in bound.stream("Weather in Paris?"):
        full = chunk if full is None else full + chunk
    assert full.tool_calls[0]["args"] == {"city": "Paris"} and full.content == ""


def test_local_only_call_options_are_refused_before_any_request() -> None:
    llm = ChatNGramTrie(base_url=URL, model="served-model")
    client = on_recorded_vllm(llm, *ANSWER)
    with pytest.raises(ValueError, match="method apply to the local engine only"):
        llm.invoke(QUESTION, method="none")
    with pytest.warns(DeprecationWarning, match="'draft_method' is deprecated"), \
            pytest.raises(ValueError, match="method apply to the local engine only"):
        llm.invoke(QUESTION, draft_method="none")
    with pytest.raises(ValueError, match="num_draft, repetition_stop apply to the local"):
        llm.invoke(QUESTION, num_draft=4, repetition_stop=3)
    assert client.requests == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_fails_clearly() -> None:
    llm = ChatNGramTrie(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        llm.invoke(QUESTION)
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        list(llm.stream(QUESTION))


async def test_an_unreachable_server_fails_async_calls_clearly() -> None:
    llm = NGramTrieLLM(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.ainvoke("Where was Socrates born?")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.abatch(["one", "two"])
