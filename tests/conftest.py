"""Shared fixtures: the packaged default model, loaded once per session (fp32)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
GPU_RUN = os.environ.get("NGRAM_TRIE_RAG_TEST_GPU") == "1"  # see ../conftest.py
# helper modules: tiny_model, data_files, retrieval_support, greedy_reference
sys.path.insert(0, str(Path(__file__).parent))
from hub_cache import loaded_model, model_folder, offline_hub  # noqa: E402, F401


@pytest.fixture(scope="session")
def generator():
    from ngram_trie_rag import SpeculativeGenerator

    return SpeculativeGenerator.from_pretrained(dtype="float32", engine="eager")


@pytest.fixture(scope="module")
def one_thread():
    """Torch and FAISS on one thread for a module (``pytestmark =
    pytest.mark.usefixtures("one_thread")``): on an oversubscribed shared CPU one thread
    is several times faster (see ``limited_threads``)."""
    from retrieval_support import limited_threads

    with limited_threads(1):
        yield


@pytest.fixture()
def released(monkeypatch) -> list[str]:
    """The names of the threads that called :func:`openmp_team.release`, in order."""
    import threading

    from ngram_trie_rag.engine.cpu import openmp_team

    names: list[str] = []
    monkeypatch.setattr(openmp_team, "release",
                        lambda: names.append(threading.current_thread().name) or True)
    return names


@pytest.fixture()
def no_compiler(monkeypatch, tmp_path):
    """``unbuilt(*modules)``: a process where the C++ compiler is missing and nothing is
    cached yet, for the kernels of ``modules`` (their cells emptied); every other kernel
    keeps what it is now (built first, here), so no test leaves a later one without it."""
    from ngram_trie_rag.engine.cpu import rowwise_linear
    from ngram_trie_rag.engine.quant import fused_layer, rowwise_attention, vnni, w4a32, w8a32

    kernels = (w8a32, w4a32, vnni, rowwise_attention, fused_layer, rowwise_linear)

    def unbuilt(*modules) -> None:
        for module in kernels:
            monkeypatch.setattr(module, "_KERNEL", [] if module in modules
                                else [module.kernel()])
        monkeypatch.setenv("NGRAM_TRIE_RAG_CACHE", str(tmp_path))  # nothing built there yet
        monkeypatch.setenv("CXX", "no-such-c++")

    return unbuilt


@pytest.fixture(scope="module")
def embedder():
    """The packaged MiniLM sentence embedder."""
    from ngram_trie_rag.retrieval import Embedder

    return Embedder()


def pytest_collection_modifyitems(config, items) -> None:
    """``gpu`` tests need CUDA and a run that asked for it; the rest run on the CPU."""
    if GPU_RUN:
        import torch

        if torch.cuda.is_available() or os.environ.get("NGRAM_TRIE_RAG_TEST_DEVICE") == "cpu":
            return  # (on the CPU: the gpu tests' own code, checked at small sizes)
        reason = "no CUDA device on this host"
    else:
        reason = "CUDA is hidden from the CPU suite: run make test-gpu"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
