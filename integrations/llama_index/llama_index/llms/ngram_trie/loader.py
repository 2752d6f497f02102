"""One model per process: every ``NGramTrieLLM`` with the same model and trie settings
shares one ``SpeculativeGenerator`` (weights, tokenizer and the lock that serialises calls).

Query engines, chat engines and condense steps often build their own LLM objects, and each
copy of even a small model costs memory and load time; one generator per model also keeps
concurrent requests queued on a single lock instead of competing for the same cores.
"""

from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

from ngram_trie_rag import SpeculativeGenerator


class GeneratorKey(NamedTuple):
    """What makes two generators different: the model, where it runs, and the trie shape
    (per-call settings such as ``num_draft`` are passed with each request instead)."""

    model_path: str | None
    device: str | None
    dtype: str | None
    n: int
    prefix_len: int


_GENERATORS: dict[GeneratorKey, SpeculativeGenerator] = {}
_LOAD_LOCK = threading.Lock()
_OPEN_LOCKS: weakref.WeakKeyDictionary[SpeculativeGenerator, threading.Lock] = (
    weakref.WeakKeyDictionary()
)


def shared_generator(key: GeneratorKey) -> SpeculativeGenerator:
    """The generator for ``key``, loading the model on the first request only."""
    with _LOAD_LOCK:
        gen = _GENERATORS.get(key)
        if gen is None:
            gen = SpeculativeGenerator.from_pretrained(
                key.model_path, device=key.device, dtype=key.dtype,
                n=key.n, prefix_len=key.prefix_len,
            )
            _GENERATORS[key] = gen
        return gen


def open_lock(gen: SpeculativeGenerator) -> threading.Lock:
    """A lock for tokenising a request's prompt and documents.

    ``SpeculativeGenerator.stream`` tokenises before it takes the generation lock; a fast
    tokenizer shared by many threads at once can fail ("Already borrowed"), so requests
    that open streams concurrently (e.g. many ``aquery`` at once) take turns here.
    """
    with _LOAD_LOCK:
        return _OPEN_LOCKS.setdefault(gen, threading.Lock())
