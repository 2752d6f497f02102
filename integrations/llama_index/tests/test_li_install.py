"""Importing the package attaches nothing to LlamaIndex's instrumentation; building an
``NGramTrieLLM`` attaches the span tracker, once however many are built."""

from __future__ import annotations

import subprocess
import sys

TRACKERS = """
import llama_index.llms.ngram_trie
from llama_index.core.instrumentation import get_dispatcher

def trackers():
    return sum(type(h).__name__ == "RetrievedNodesTracker"
               for h in get_dispatcher().span_handlers)

print("import", trackers())
from llama_index.llms.ngram_trie import NGramTrieLLM
NGramTrieLLM(model_name="/no/such/model")  # building loads nothing
print("first", trackers())
NGramTrieLLM()
NGramTrieLLM(n=9, prefix_len=2)
print("more", trackers())
"""


def test_importing_attaches_nothing_and_building_attaches_once():
    out = subprocess.run([sys.executable, "-c", TRACKERS], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["import", "0", "first", "1", "more", "1"]
