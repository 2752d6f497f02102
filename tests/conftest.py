"""Shared fixtures: the packaged default model, loaded once per session (fp32)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # helper modules: tiny_model, data_files


@pytest.fixture(scope="session")
def generator():
    from ngram_trie_rag import SpeculativeGenerator

    return SpeculativeGenerator.from_pretrained(dtype="float32")
