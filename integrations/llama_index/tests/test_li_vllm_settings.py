"""Choosing where NGramTrieLLM runs (local engine, vLLM server, vLLM in-process): settings
that contradict or that another place reads fail at construction, nothing is loaded or
contacted before a call, what a vLLM backend receives, and the finished-answer record
reads the same from every engine.

vLLM does not run here: a stand-in for its client (the served model's deltas) sits behind
the core's real ``VLLMBackend``. The vLLM paths themselves run against a real server and
engine in tests/with_vllm.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock
from llama_index.core.schema import TextNode
from llama_index.core.tools import FunctionTool
from ngram_trie_rag.backends import VLLMBackend
from ngram_trie_rag.decoding.options import GenerationOptions
from ngram_trie_rag.serving.openai_http import Delta
from ngram_trie_rag.wrappers import settings as wrapper

from llama_index.llms.ngram_trie import NGramTrieLLM

URL = "http://127.0.0.1:8000/v1"
ACCEPTANCE = {"mean_acceptance_length": 3.0}
PASSAGES = ["Socrates was born in Alopece.", "Plato founded the Academy."]
REPLY = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'


class ServedModel:
    """Stands in for vLLM's client (server or engine): answers ``text`` in two deltas and
    records every request it gets as (prompt, documents, options)."""

    name = "vllm-server"
    model_name = "served-model"
    context_window = 4096

    def __init__(self, text: str = "Alopece.") -> None:
        self.text = text
        self.requests: list[tuple[Any, list[str] | None, GenerationOptions]] = []

    def _deltas(self, prompt: Any, documents: list[str] | None,
                options: GenerationOptions) -> list[Delta]:
        self.requests.append((prompt, documents, options))
        half = len(self.text) // 2
        return [Delta(self.text[:half]), Delta(self.text[half:]),
                Delta("", "stop", 40, 7, ACCEPTANCE)]

    def stream(self, *request: Any):
        yield from self._deltas(*request)

    async def astream(self, *request: Any):
        for delta in self._deltas(*request):
            yield delta

    def complete(self, *request: Any) -> Delta:
        self._deltas(*request)
        return Delta(self.text, "stop", 40, 7, ACCEPTANCE)

    async def acomplete(self, *request: Any) -> Delta:
        return self.complete(*request)


def serve(monkeypatch: pytest.MonkeyPatch) -> tuple[ServedModel, list[Any]]:
    """From now on every LLM opens a ``VLLMBackend`` over one ``ServedModel``: that model,
    and the backend settings each LLM asked for."""
    model, asked = ServedModel(), []

    def open_backend(settings: Any) -> VLLMBackend:
        asked.append(settings)
        return VLLMBackend(model)

    monkeypatch.setattr(wrapper, "open_backend", open_backend)
    return model, asked


@pytest.fixture
def served(monkeypatch):
    return serve(monkeypatch)


def test_base_url_and_in_process_vllm_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="base_url and backend='vllm' exclude each other"):
        NGramTrieLLM(base_url=URL, backend="vllm")
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        NGramTrieLLM(backend="tgi")


def test_settings_another_place_reads_are_refused() -> None:
    with pytest.raises(ValueError, match=r"method, prefix_len cannot be used"):
        NGramTrieLLM(base_url=URL, prefix_len=2, method="chain")
    with pytest.raises(ValueError, match=r"model_path \(use model_name for the served model"):
        NGramTrieLLM(base_url=URL, model_path="/models/x")
    with pytest.raises(ValueError, match=r"vllm_engine_args cannot be used .* 'local'"):
        NGramTrieLLM(vllm_engine_args={"dtype": "float32"})
    with pytest.raises(ValueError, match=r"dtype cannot be used .* 'vllm'"):
        NGramTrieLLM(backend="vllm", dtype="float32")
    with pytest.raises(ValueError, match=r"generator cannot be used .* 'vllm'"):
        NGramTrieLLM(object(), backend="vllm")


def test_vllm_settings_build_without_loading_or_contacting_anything() -> None:
    server = NGramTrieLLM(base_url=URL, model_name="smollm2", api_key="secret",
                          context_window=4096)
    assert server.runs_on == "vllm-server"
    meta = server.metadata  # all given: no request needed
    assert (meta.model_name, meta.context_window, meta.is_chat_model) == ("smollm2", 4096, True)
    assert "secret" not in repr(server) and "api_key" not in server.to_dict()
    engine = NGramTrieLLM(backend="vllm", num_speculative_tokens=4)
    assert engine.runs_on == "vllm" and engine._backend is None  # nothing opened yet


def test_what_each_vllm_place_is_asked_for(served) -> None:
    _, asked = served
    llms = [NGramTrieLLM(base_url=URL, model_name="smollm2", api_key="secret",
                         request_timeout=5.0),
            NGramTrieLLM(backend="vllm", model_name="/models/x", num_speculative_tokens=4,
                         vllm_engine_args={"dtype": "float32"})]
    assert all(isinstance(llm.active_backend, VLLMBackend) for llm in llms)
    server, engine = asked
    assert (server.place, server.model, server.base_url, server.api_key,
            server.request_timeout) == ("vllm-server", "smollm2", URL, "secret", 5.0)
    assert (engine.place, engine.model, engine.num_speculative_tokens,
            engine.vllm_engine_args) == ("vllm", "/models/x", 4, {"dtype": "float32"})


def test_a_vllm_request_carries_the_options_and_node_texts(served) -> None:
    model, _ = served
    llm = NGramTrieLLM(base_url=URL, max_new_tokens=9, temperature=0.5, seed=3)
    nodes = [TextNode(id_="a", text=PASSAGES[0]), TextNode(id_="b", text=PASSAGES[1]),
             TextNode(id_="c", text=PASSAGES[0]), TextNode(id_="d", text=" ")]
    answer = llm.complete("Where was Socrates born?", documents=nodes, stop=["\n"],
                          max_tokens=5)
    [(prompt, documents, options)] = model.requests
    assert prompt == [{"role": "user", "content": "Where was Socrates born?"}]  # chat model
    assert documents == PASSAGES  # each text once, the blank one dropped, by the core
    assert answer.raw["draft_node_ids"] == ["a", "b", "c", "d"]  # as retrieved
    assert answer.raw["speculative"]["num_documents"] == 2
    assert options == GenerationOptions(max_new_tokens=5, temperature=0.5, seed=3,
                                        stop=("\n",))
    assert llm.metadata.model_name == "served-model"  # the server's, none given


def test_the_finished_record_reads_the_same_from_every_engine(li_llm, monkeypatch) -> None:
    local = li_llm.complete("Hello", documents=PASSAGES, max_new_tokens=4)  # the real model
    serve(monkeypatch)
    llm = NGramTrieLLM(base_url=URL, model_name="smollm2")
    answer = llm.complete("Hello", documents=PASSAGES)
    assert answer.text == "Alopece."
    assert answer.additional_kwargs.keys() == local.additional_kwargs.keys()
    assert answer.raw.keys() == local.raw.keys() - {"token_ids"}  # vLLM hands out none
    assert answer.additional_kwargs["speculative"] == answer.raw["speculative"] == {
        "backend": "vllm-server", "draft_source": "documents", "num_documents": 2,
        "acceptance": ACCEPTANCE, "answer_scope": None}
    assert answer.raw["usage"] == {"prompt_tokens": 40, "completion_tokens": 7,
                                   "total_tokens": 47}
    assert (answer.additional_kwargs["model_name"], answer.raw["draft_origin"],
            answer.raw["draft_texts"]) == ("smollm2", "documents", PASSAGES)
    bare = llm.complete("Hello", formatted=True)
    assert bare.raw["speculative"]["draft_source"] == "prompt"
    assert bare.raw["draft_node_ids"] == [] and bare.raw["draft_texts"] == []


async def test_vllm_streams_end_with_the_record(served) -> None:
    llm = NGramTrieLLM(base_url=URL, model_name="smollm2")
    chunks = list(llm.stream_complete("Hello"))
    assert "".join(c.delta for c in chunks) == "Alopece." == chunks[-1].text
    assert chunks[-1].additional_kwargs["finish_reason"] == "stop"
    assert all(not c.additional_kwargs for c in chunks[:-1])
    achunks = [c async for c in await llm.astream_chat([ChatMessage(role="user",
                                                                    content="Hello")])]
    assert achunks[-1].message.content == "Alopece."
    assert achunks[-1].raw["speculative"]["acceptance"] == ACCEPTANCE
    assert (await llm.acomplete("Hello")).text == "Alopece."


def test_a_tool_reply_from_vllm_is_parsed_once(served) -> None:
    model, _ = served
    model.text = REPLY

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = NGramTrieLLM(base_url=URL, model_name="smollm2")
    response = llm.chat_with_tools([FunctionTool.from_defaults(get_weather)],
                                   user_msg="Weather in Paris?")
    [(_, _, options)] = model.requests
    assert options.grammar is not None  # the reply's shape goes with the request
    [call] = llm.get_tool_calls_from_response(response)
    [block] = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    assert (call.tool_name, call.tool_kwargs) == ("get_weather", {"city": "Paris"})
    assert call.tool_id == block.tool_call_id and response.raw["reply"] == REPLY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_local_only_options_and_an_unreachable_server_fail_clearly() -> None:
    llm = NGramTrieLLM(base_url=f"http://127.0.0.1:{free_port()}/v1", model_name="m",
                       context_window=4096)
    with pytest.raises(ValueError, match="num_draft apply to the local engine only"):
        llm.complete("Hello", num_draft=4)
    with pytest.raises(ValueError, match="repetition_stop apply to the local engine only"):
        llm.stream_complete("Hello", repetition_stop=3)
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        llm.complete("Hello")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.acomplete("Hello")
