"""The local OpenAI-compatible server (``ngram-trie-rag serve --engine local``) over the
packaged model: what its client (``OpenAIHTTPBackend``, the wrappers' ``base_url=``) gets
back equals the generator's own greedy answer, with documents reaching the drafter; bad
requests get OpenAI error bodies with the right status; the command starts, answers and
stops on Ctrl-C; ``bench-serve`` runs the local methods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from data_files import SHARED_DATA

from ngram_trie_rag.decoding.options import GenerationOptions
from ngram_trie_rag.serving.local_server import LocalServer, for_generator
from ngram_trie_rag.serving.openai_http import OpenAIHTTPBackend

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENS = 16
DOCS = ["The Aurora K3 needs descaling every 200 cups.",
        "Error E2 on the Aurora K3: the thermoblock overheated; let it cool for ten minutes."]
CHAT = [{"role": "user", "content": "What does error E2 mean on the Aurora K3?"}]
PROMPT = "Error E2 on the Aurora K3 means"
GREEDY = GenerationOptions(max_new_tokens=TOKENS)


@pytest.fixture(scope="module")
def server(generator) -> Any:
    served = for_generator(generator, generator).start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(server: LocalServer) -> OpenAIHTTPBackend:
    return OpenAIHTTPBackend(server.url, timeout=60)


def post(server: LocalServer, path: str, body: bytes | dict) -> tuple[int, dict]:
    """(status, JSON body) of a raw POST, error statuses included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.host}:{server.port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


def get(server: LocalServer, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://{server.host}:{server.port}{path}",
                                    timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


# ---- answers ------------------------------------------------------------------------------
def test_chat_and_completion_answers_are_the_generators_own(generator, client) -> None:
    for prompt in (CHAT, PROMPT):
        own = generator.generate(prompt, DOCS, GREEDY)
        answer = client.complete(prompt, DOCS, GREEDY)
        assert answer.text == own.text
        assert answer.completion_tokens == len(own.token_ids)
        assert answer.prompt_tokens == own.prompt_tokens
        assert answer.finish_reason == own.finish_reason  # "length", "eos" or "stop"
        spec = answer.speculative
        assert spec["draft_source"] == "documents" and spec["num_documents"] == 2
        assert spec["method"] == "trie"
        # the draft budget adapts across calls: the steps differ, the tokens do not
        assert 1 <= spec["num_spec_steps"] < answer.completion_tokens
        assert spec["mean_acceptance_length"] >= 1.0


def test_streamed_deltas_join_to_the_same_answer_with_usage(generator, client) -> None:
    own = generator.generate(CHAT, DOCS, GREEDY)
    deltas = list(client.stream(CHAT, DOCS, GREEDY))
    *texts, last = deltas
    assert texts and all(d.text and d.finish_reason is None for d in texts)
    assert "".join(d.text for d in texts) == own.text
    assert (last.prompt_tokens, last.completion_tokens) == (own.prompt_tokens,
                                                            len(own.token_ids))
    assert last.speculative["draft_source"] == "documents"
    no_docs = list(client.stream(PROMPT, None, GREEDY))[-1]
    assert no_docs.speculative["draft_source"] == "prompt"


def test_a_stop_string_and_usage_totals(generator, server) -> None:
    status, body = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": TOKENS,
                                                    "stop": [" the", "."]})
    own = generator.generate(PROMPT, None, GREEDY.with_changes(stop=(" the", ".")))
    assert status == 200 and body["choices"][0]["text"] == own.text
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    if own.finish_reason == "stop":
        assert body["choices"][0]["stop_reason"] in (" the", ".")


def test_models_and_health(server, client, generator) -> None:
    assert get(server, "/health") == (200, {"status": "ok"})
    status, models = get(server, "/v1/models")
    assert status == 200 and models["data"][0]["id"] == server.model_name
    assert client.context_window == generator.context_window
    assert models["data"][0]["owned_by"] == "ngram-trie-rag" and client.served_by == "local-server"


# ---- errors -------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}, 400, "n=2"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "best_guess": 1}, 400, "best_guess"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-4"}, 404, "gpt-4"),
    ("/v1/embeddings", {"input": "Hi"}, 404, "no such endpoint"),
])
def test_bad_requests_get_openai_errors(server, path, body, status, words) -> None:
    got, payload = post(server, path, body)
    assert got == status
    error = payload["error"]
    assert words in error["message"] and error["code"] == status and error["type"]


def test_harmless_fields_are_accepted(server) -> None:
    status, body = post(server, "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "n": 1, "user": "u", "logprobs": False,
        "model": server.model_name})
    assert status == 200 and body["usage"]["completion_tokens"] <= 2


def test_a_full_queue_is_503(generator) -> None:
    from ngram_trie_rag.serving.scheduler import BatchScheduler

    # one row, one place in the queue: an unread stream holds the row (paused after one
    # step), a second waits, so the server's request finds the queue full
    with BatchScheduler(generator, max_batch=1, max_queue=1, buffer_steps=1,
                        capacity=256) as scheduler:
        holding = scheduler.stream(PROMPT, max_new_tokens=8)
        deadline = time.monotonic() + 60
        while scheduler.running < 1 and time.monotonic() < deadline:  # in the row
            time.sleep(0.02)
        waiting = scheduler.stream(PROMPT, max_new_tokens=8)
        with LocalServer(scheduler, "m") as server:
            status, body = post(server, "/v1/completions", {"prompt": "Hi"})
        holding.close()
        waiting.close()
    assert status == 503 and "max_queue=1" in body["error"]["message"]
    assert body["error"]["code"] == 503


def test_a_client_that_leaves_mid_stream_ends_its_generation(generator, server) -> None:
    body = {"prompt": PROMPT, "max_tokens": 200, "stream": True}
    request = urllib.request.Request(f"{server.url}/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.readline()  # the first event: generation has started
    deadline = time.monotonic() + 20
    while generator.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not generator.busy  # the stream was closed, not run to 200 tokens
    assert post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200


def test_langchain_chat_against_the_server(generator, server) -> None:
    lc = pytest.importorskip("langchain_ngram_trie")
    from langchain_core.messages import HumanMessage

    chat = lc.ChatNGramTrie(base_url=server.url, max_tokens=TOKENS)
    reply = chat.invoke([HumanMessage(CHAT[0]["content"])], documents=DOCS)
    assert reply.content == generator.generate(CHAT, DOCS, GREEDY).text
    speculative = reply.response_metadata["speculative"]
    assert speculative["acceptance"]["draft_source"] == "documents"
    assert speculative["backend"] == "local-server"  # not vLLM's: the server says whose it is


def test_the_server_stops_cleanly(generator) -> None:
    server = for_generator(generator, generator)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    assert post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200
    server.stop()  # from another thread than the serving one
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{server.url}/models", timeout=5)


# ---- the command ----------------------------------------------------------------------------
def test_serve_local_command_answers_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ngram_trie_rag.commands.cli", "serve",
                             "--engine", "local", "--port", "0", "--prefill-chunk", "128"],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        banner = proc.stdout.readline()
        assert banner.startswith("ngram-trie-rag serve: http://127.0.0.1:"), (
            banner + proc.stderr.read() if proc.poll() is not None else banner)
        url = banner.split()[2]
        assert url.endswith("/v1") and "model SmolLM2-135M-Instruct" in banner
        assert "backend " in banner and "batch " in banner and "cache " in banner
        assert "chunks of 128 tokens" in banner
        answer = OpenAIHTTPBackend(url, timeout=60).complete(CHAT, DOCS, GREEDY)
        assert answer.completion_tokens and answer.speculative["draft_source"] == "documents"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.strip().splitlines() == ["ngram-trie-rag serve: stopped"]


# ---- bench-serve ------------------------------------------------------------------------------
# fp32 on Spec-Bench RAG (drafts from the prompt) at 1 and 2 users; int4 on HAGRID (drafts
# from each request's documents) at 2
@pytest.mark.parametrize(("quantization", "data", "users"), [
    (None, "spec_bench/rag.jsonl", (1, 2)), ("int4", "hagrid/hagrid.jsonl", (2,))])
def test_bench_serve_runs_the_local_methods(quantization: str | None, data: str,
                                             users: tuple[int, ...]) -> None:
    from ngram_trie_rag.bench.serve import run_bench_serve, table

    path = SHARED_DATA / data
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder sits beside the project)")
    doc = run_bench_serve(str(path), methods=["local", "local-trie"], concurrency=list(users),
                          limit=2, max_new_tokens=8, quantization=quantization)
    assert doc["meta"]["quantization"] == quantization
    rows = {(r["method"], r["concurrency"]): r for r in doc["results"]}
    assert set(rows) == {(m, c) for m in ("local", "local-trie") for c in users}
    for (method, _), row in rows.items():
        assert row["exact_match_rate"] == 1.0
        assert row["steps"] == "eager"  # a CPU's batched steps
        assert 0 < row["output_tokens"] <= 16 and row["output_tokens_per_s"] > 0
        assert row["p90_latency_s"] >= row["mean_latency_s"] * 0.5
        if method == "local":
            assert row["mean_accept_length"] == 1.0
        else:
            assert row["mean_accept_length"] >= 1.0
    assert "| local-trie | 2 |" in table(doc["results"])
    assert doc["meta"]["prompts"] == 2
