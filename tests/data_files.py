"""The shared benchmark data (``../shared/data`` beside the project, or
``$NGRAM_TRIE_RAG_DATA``) and its rows. The folder is not part of the project, so tests
that read it skip where it is absent."""

from __future__ import annotations

from itertools import islice

import pytest

from ngram_trie_rag.retrieval.jsonl import read_jsonl as read_rows
from ngram_trie_rag.util.cache_paths import data_dir

SHARED_DATA = data_dir()


def read_jsonl(relative: str, limit: int | None = None) -> list[dict]:
    """The first ``limit`` rows of a JSONL file under :data:`SHARED_DATA`; the test is
    skipped when the file is absent (the folder is not part of the project)."""
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data folder sits beside the project)")
    return [row for _, row in islice(read_rows(path), limit)]
