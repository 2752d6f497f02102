"""Shared fixtures: the packaged default model, loaded once per session (fp32)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def read_jsonl(relative: str, limit: int | None = None) -> list[dict]:
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder sits beside the project)")
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return rows[:limit]


@pytest.fixture(scope="session")
def generator():
    from ngram_trie_rag import SpeculativeGenerator

    return SpeculativeGenerator.from_pretrained(dtype="float32")
