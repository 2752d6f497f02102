"""vLLM's OpenAI-compatible server started by ``ngram-trie-rag serve``: documents passed
per request reach the trie proposer, answers are plain greedy decoding's, a malformed
request does not take the server down, and tensor parallelism (2 CPU ranks) runs the
same code.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from itertools import islice
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from data_files import SHARED_DATA  # noqa: E402
from servers import Server, start, stop  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from ngram_trie_rag.reference import greedy_reference  # noqa: E402
from ngram_trie_rag.retrieval.jsonl import read_jsonl  # noqa: E402
from ngram_trie_rag.serving.vllm_proposer import DOCUMENTS  # noqa: E402

MAX_TOKENS = 40


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())


def _accepted(server_root: str) -> float:
    with urllib.request.urlopen(server_root + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:spec_decode_num_accepted_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _hagrid(count: int) -> list[tuple[str, list[str]]]:
    rows = islice(read_jsonl(SHARED_DATA / "hagrid" / "hagrid.jsonl"), count)
    return [(row["turns"][0], [p for p in row["context"].split("\n\n") if p.strip()])
            for _, row in rows]


def _chat(server: Server, question: str, documents: object) -> dict:
    body = {"model": server.model, "messages": [{"role": "user", "content": question}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    if documents is not None:
        body["vllm_xargs"] = {DOCUMENTS: documents}
    return _post(server.base_url + "/chat/completions", body)


def _strip_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == eos else ids


def test_server_answers_with_documents_per_request(vllm_server: Server) -> None:
    root = vllm_server.base_url.removesuffix("/v1")
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32,
                                                 local_files_only=True)
    before = _accepted(root)
    for question, documents in _hagrid(3):
        reply = _chat(vllm_server, question, documents)
        ids = reply["choices"][0]["token_ids"]
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                               add_generation_prompt=True, tokenize=True)
        prompt = list(getattr(prompt, "input_ids", prompt))
        assert reply["prompt_token_ids"] == prompt
        expected = greedy_reference(model, prompt, MAX_TOKENS)
        eos = tokenizer.eos_token_id
        assert _strip_eos(ids, eos) == _strip_eos(expected, eos)
        assert reply["usage"]["completion_tokens"] == len(ids)
    assert _accepted(root) > before  # the documents were drafted from


def test_malformed_documents_do_not_take_the_server_down(vllm_server: Server) -> None:
    question, documents = _hagrid(1)[0]
    good = _chat(vllm_server, question, documents)["choices"][0]["message"]["content"]
    for bad in ("one string, not a list", [10**9, 5]):
        reply = _chat(vllm_server, question, bad)  # drafted from the prompt instead
        assert reply["choices"][0]["message"]["content"] == good
    with pytest.raises(urllib.error.HTTPError) as refused:  # vLLM's own schema check
        _chat(vllm_server, question, [["nested", "lists"]])
    assert refused.value.code == 400
    assert _chat(vllm_server, question, documents)["choices"][0]["message"]["content"] == good


def test_tensor_parallel_two_ranks(tmp_path: Path) -> None:
    folder = os.environ.get("NGRAM_TRIE_RAG_TP_MODEL_DIR")
    if not folder:
        pytest.skip("NGRAM_TRIE_RAG_TP_MODEL_DIR names no model whose heads split in two")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallelism over CPU ranks needs two CPUs")
    proc, port = start(folder, "tp2", tmp_path / "tp2.log", "--tensor-parallel-size", "2")
    log = tmp_path / "tp2.log"
    try:
        document = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars "
                    "in Paris, France. It is named after the engineer Gustave Eiffel.")
        prompt_text = document + "\nQ: Where is the Eiffel Tower?\nA: The Eiffel Tower is"
        reply = _post(f"http://127.0.0.1:{port}/v1/completions",
                      {"model": "tp2", "prompt": prompt_text, "max_tokens": 16, "temperature": 0,
                       "return_token_ids": True, "vllm_xargs": {DOCUMENTS: [document]}})
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     local_files_only=True)
        prompt = reply["choices"][0]["prompt_token_ids"]  # per choice in completions
        assert prompt == tokenizer(prompt_text)["input_ids"]
        assert reply["choices"][0]["token_ids"] == greedy_reference(model, prompt, 16)
        assert "tensor_parallel_size=2" in log.read_text()
        assert _accepted(f"http://127.0.0.1:{port}") > 0
    finally:
        stop(proc)
