"""Every test run is pinned to the CPU whatever the host has (fp32, the CPU fast paths,
CPU random streams), so CUDA is hidden before anything imports torch. ``make test-gpu``
sets NGRAM_TRIE_RAG_TEST_GPU=1 and runs only the tests marked ``gpu``."""

import os

if os.environ.get("NGRAM_TRIE_RAG_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
