"""Every test run is pinned to the CPU whatever the host has (fp32, the CPU fast paths,
CPU random streams), so CUDA is hidden before anything imports torch. ``make test-gpu``
sets NGRAM_TRIE_RAG_TEST_GPU=1 and runs only the tests marked ``gpu``."""

import os

# engine="auto" stays eager in every test, notebook and command the suite runs: a first
# answer would otherwise start compiling the model for minutes beside the rest of the
# suite (tests/test_auto_engine.py lets it choose).
os.environ.setdefault("NGRAM_TRIE_RAG_AUTO_ENGINE", "eager")
# Nor does a second answer start measuring the forward variants in another process
# (tests/test_background_measure.py lets it).
os.environ.setdefault("NGRAM_TRIE_RAG_MEASURE", "off")

if os.environ.get("NGRAM_TRIE_RAG_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
