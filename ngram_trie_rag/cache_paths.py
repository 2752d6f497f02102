"""Where this package keeps what it makes (converted models, indexes, latency curves,
resident workers): ``$NGRAM_TRIE_RAG_CACHE``, else the user cache. Imports neither torch
nor transformers, so a command's thin client can use it."""

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
