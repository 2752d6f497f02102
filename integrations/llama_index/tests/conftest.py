"""Fixtures: the packaged model (loaded once), MiniLM embeddings, a vector index over wiki
passages, the plain greedy reference LLM and a recorder of speculative LLM calls."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

from li_support import WIKI, PlainGreedyLLM, SpeculativeCalls, wiki_nodes  # noqa: E402

# the core tests' hub cache (tests/hub_cache.py): loading by hub id, offline
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from hub_cache import loaded_model, model_folder, offline_hub  # noqa: E402, F401

MAX_NEW_TOKENS = 32


@pytest.fixture(scope="session")
def li_llm():
    from llama_index.llms.ngram_trie import NGramTrieLLM

    return NGramTrieLLM(max_new_tokens=MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def li_plain_llm(li_llm):
    return PlainGreedyLLM(li_llm.generator, li_llm.metadata, MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def li_nodes():
    if not WIKI.is_file():
        pytest.skip(f"{WIKI} not found (the shared data folder sits beside the project)")
    return wiki_nodes(30)


@pytest.fixture(scope="session")
def li_embed_model():
    from llama_index.llms.ngram_trie import SentenceTransformerEmbedding

    return SentenceTransformerEmbedding()


@pytest.fixture(scope="session")
def li_index(li_nodes, li_embed_model):
    from llama_index.core import VectorStoreIndex

    return VectorStoreIndex(li_nodes, embed_model=li_embed_model)


@pytest.fixture(scope="session")
def _li_recorder():
    from llama_index.core.instrumentation import get_dispatcher

    recorder = SpeculativeCalls()
    get_dispatcher().add_event_handler(recorder)
    return recorder


@pytest.fixture
def li_calls(_li_recorder):
    """Speculative LLM calls made during the test."""
    _li_recorder.clear()
    yield _li_recorder
    _li_recorder.clear()


@pytest.fixture(autouse=True)
def _li_no_leak():
    """Every test ends with no retrieved nodes held and no span left open."""
    yield
    from llama_index.llms.ngram_trie import get_tracker, registry_size

    assert registry_size() == 0
    assert get_tracker().num_open_spans == 0
