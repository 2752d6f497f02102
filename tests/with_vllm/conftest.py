"""Fixtures for the vLLM tests: the converted model folder and one running server.

The server is vLLM's own OpenAI-compatible server started by ``ngram-trie-rag serve``
(the trie proposer in it), on a free local port, once per session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from servers import Server, start, stop  # noqa: E402


@pytest.fixture(scope="session")
def model_dir() -> str:
    folder = os.environ.get("NGRAM_TRIE_RAG_MODEL_DIR")
    if not folder:
        pytest.skip("NGRAM_TRIE_RAG_MODEL_DIR names no converted model folder")
    return folder


@pytest.fixture(scope="session")
def vllm_server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc, port = start(model_dir, "smollm2", log)
    try:
        yield Server(f"http://127.0.0.1:{port}/v1", "smollm2", model_dir)
    finally:
        stop(proc)
