"""Choosing where NGramTrieLLM runs (local engine, vLLM server, vLLM in-process): settings
that contradict or that another place reads fail at construction, nothing is loaded or
contacted before a call, and the finished-answer record reads the same from every engine.

The vLLM paths themselves run against a real server and engine in tests/with_vllm.
"""

from __future__ import annotations

import socket

import pytest
from ngram_trie_rag.serving.openai_http import Delta, GenerationOptions

from llama_index.llms.ngram_trie import NGramTrieLLM
from llama_index.llms.ngram_trie.backends import Outcome, vllm_options

URL = "http://127.0.0.1:8000/v1"


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


def test_vllm_settings_build_without_loading_or_contacting_anything() -> None:
    server = NGramTrieLLM(base_url=URL, model_name="smollm2", api_key="secret",
                          context_window=4096)
    assert server.runs_on == "vllm-server"
    meta = server.metadata  # all given: no request needed
    assert (meta.model_name, meta.context_window, meta.is_chat_model) == ("smollm2", 4096, True)
    assert "secret" not in repr(server) and "api_key" not in server.to_dict()
    engine = NGramTrieLLM(backend="vllm", num_speculative_tokens=4)
    assert engine.runs_on == "vllm" and engine._vllm is None and engine._generator is None


def test_outcomes_read_alike_from_every_engine() -> None:
    last = Delta("", "stop", 40, 7, {"mean_acceptance_length": 3.0})
    outcome = Outcome.from_vllm("vllm", "Alopece.", last, num_documents=2)
    assert outcome == Outcome("Alopece.", "stop", 40, 7, {
        "backend": "vllm", "draft_source": "documents", "num_documents": 2,
        "acceptance": {"mean_acceptance_length": 3.0}})
    bare = Outcome.from_vllm("vllm-server", "x", Delta("", "length", 3, 1), num_documents=0)
    assert bare.speculative["draft_source"] == "prompt"
    assert bare.speculative["acceptance"] is None and bare.token_ids is None
    assert vllm_options({"max_new_tokens": 9, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                         "stop": None, "seed": None}) == GenerationOptions(max_tokens=9)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_local_only_options_and_an_unreachable_server_fail_clearly() -> None:
    llm = NGramTrieLLM(base_url=f"http://127.0.0.1:{free_port()}/v1", model_name="m",
                       context_window=4096)
    with pytest.raises(ValueError, match="num_draft apply to the local engine only"):
        llm.complete("Hello", num_draft=4)
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        llm.complete("Hello")
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        await llm.acomplete("Hello")
