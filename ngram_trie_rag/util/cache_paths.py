"""Where this package keeps what it makes (converted models, indexes, latency curves,
resident workers): ``$NGRAM_TRIE_RAG_CACHE``, else the user cache; and where it reads the
benchmark data sets from: ``$NGRAM_TRIE_RAG_DATA``, else ``../shared/data`` beside the
source tree. Imports neither torch nor transformers, so a command's thin client can use it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$NGRAM_TRIE_RAG_CACHE`` or ``<user cache>/ngram-trie-rag``."""
    env = os.environ.get("NGRAM_TRIE_RAG_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ngram-trie-rag"))


def data_dir() -> Path:
    """``$NGRAM_TRIE_RAG_DATA`` or ``shared/data`` in the folder that holds the source tree.

    The benchmark data sets are large and not part of the source, so they sit beside it;
    the path is only computed, never checked: each caller decides whether a missing file
    is an error, a skipped test or a default it need not read."""
    env = os.environ.get("NGRAM_TRIE_RAG_DATA")
    if env:
        return Path(env)
    source_tree = Path(__file__).resolve().parents[2]  # util/ -> ngram_trie_rag/ -> tree
    return source_tree.parent / "shared" / "data"
