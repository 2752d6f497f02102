"""Choosing where calls run (local engine, vLLM server, vLLM in-process): contradicting or
foreign settings fail at construction, and nothing is loaded or contacted before a call.

The vLLM paths themselves run against a real server and engine in tests/with_vllm.
"""

from __future__ import annotations

import socket

import pytest
from langchain_core.messages import HumanMessage
from ngram_trie_rag.serving.openai_http import GenerationOptions

from langchain_ngram_trie import ChatNGramTrie, NGramTrieLLM
from langchain_ngram_trie.backends import vllm_options

URL = "http://127.0.0.1:8000/v1"


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
    assert ChatNGramTrie(api_key="test").runs_on == "local"  # as LangChain's standard tests pass


def test_vllm_settings_build_without_loading_or_contacting_anything() -> None:
    server = ChatNGramTrie(base_url=URL, model="smollm2", api_key="secret", max_tokens=8)
    assert server.runs_on == "vllm-server"
    assert server._identifying_params == {
        "model": "smollm2", "base_url": URL, "max_tokens": 8, "temperature": 0.0,
        "top_p": 1.0, "top_k": 0, "seed": None}
    assert "secret" not in repr(server)  # a SecretStr
    assert server._get_ls_params()["ls_model_name"] == "smollm2"
    engine = NGramTrieLLM(backend="vllm", vllm_engine_args={"dtype": "float32"})
    assert engine.runs_on == "vllm"
    assert engine._identifying_params["vllm_engine_args"] == {"dtype": "float32"}
    assert engine._vllm is None  # the engine starts on the first call
    assert ChatNGramTrie().runs_on == "local"


def test_call_options_map_onto_vllm_requests() -> None:
    options = {"max_new_tokens": 12, "temperature": 0.5, "top_p": 0.9, "top_k": 5,
               "seed": 7, "num_draft": None, "method": None, "stop": ["\n"]}
    assert vllm_options(options) == GenerationOptions(max_tokens=12, temperature=0.5,
                                                      top_p=0.9, top_k=5, stop=("\n",), seed=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_only_call_options_and_an_unreachable_server_fail_clearly() -> None:
    llm = ChatNGramTrie(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    question = [HumanMessage("Where was Socrates born?")]
    with pytest.raises(ValueError, match="draft_method apply to the local engine only"):
        llm.invoke(question, draft_method="none")  # refused before any request
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        llm.invoke(question)
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        list(llm.stream(question))


async def test_an_unreachable_server_fails_async_calls_clearly() -> None:
    llm = NGramTrieLLM(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.ainvoke("Where was Socrates born?")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.abatch(["one", "two"])
