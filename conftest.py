"""Every test run is pinned to the CPU whatever the host has (fp32, the CPU fast paths,
CPU random streams), so CUDA is hidden before anything imports torch. ``make test-gpu``
sets NGRAM_TRIE_RAG_TEST_GPU=1 and runs only the tests marked ``gpu``."""

import os

import pytest

# engine="auto" stays eager in every test, notebook and command the suite runs: a first
# answer would otherwise start compiling the model for minutes beside the rest of the
# suite (tests/test_auto_engine.py lets it choose).
os.environ.setdefault("NGRAM_TRIE_RAG_AUTO_ENGINE", "eager")
# Nor does a second answer start measuring the forward variants in another process
# (tests/test_background_measure.py lets it).
os.environ.setdefault("NGRAM_TRIE_RAG_MEASURE", "off")

if os.environ.get("NGRAM_TRIE_RAG_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture
def held_before() -> int:
    """LangChain document-registry entries held before the test: the registry is one per
    process, and tests before this one on the same worker may have left some (a stream
    abandoned before its chain ended, released only when it is collected); each test
    checks that its own calls leave none."""
    from langchain_ngram_trie import document_registry

    return document_registry().size
