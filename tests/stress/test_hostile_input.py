"""Long and hostile input through the generator: clear errors or documented behaviour,
bounded time and memory, never a crash."""

from __future__ import annotations

import random

import numpy as np
import pytest
from stress_scale import scale
from tiny_model import tiny_llama

from ngram_trie_rag import NGramTrie, SpeculativeGenerator
from ngram_trie_rag.reference import greedy_reference

QUESTION = [{"role": "user", "content": "Summarise the documents in one sentence."}]


def test_huge_document_is_bounded_by_the_trie_limit(generator) -> None:
    text = " ".join(f"token{i % 997} value{i}" for i in range(scale(30_000, 120_000)))
    res = generator.generate(QUESTION, [text], max_new_tokens=8)
    assert res.stats.trie_tokens <= generator.config.max_trie_tokens
    assert len(res.token_ids) <= 8


@pytest.mark.parametrize("kind", ["binary", "control", "replacement", "mixed_scripts"])
def test_garbage_documents_still_give_exact_output(generator, kind: str) -> None:
    rng = random.Random(kind)
    if kind == "binary":
        doc = bytes(rng.randrange(256) for _ in range(4000)).decode("utf-8", errors="replace")
    elif kind == "control":
        doc = "".join(chr(rng.randrange(32)) for _ in range(2000)) + " text"
    elif kind == "replacement":
        doc = "\ufffd" * 500 + " end"
    else:
        doc = "Привет 世界 مرحبا 🚀 " * 200
    expected = greedy_reference(generator.model, generator.encode_prompt(QUESTION), 12)
    assert generator.generate(QUESTION, [doc], max_new_tokens=12).token_ids == expected


def test_lone_surrogates_are_a_clear_error(generator) -> None:
    with pytest.raises(ValueError, match="document 0 is not valid Unicode"):
        generator.generate(QUESTION, ["bad \udcff surrogate"], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt is not valid Unicode"):
        generator.generate("bad \ud800", max_new_tokens=4)


def test_ten_thousand_tiny_documents(generator) -> None:
    docs = [f"fact {i}: item {i % 13} costs {i % 7} coins" for i in range(scale(10_000, 10_000))]
    res = generator.generate(QUESTION, docs, max_new_tokens=8)
    assert res.stats.num_documents == len(docs)


def test_prompt_at_the_context_limit() -> None:
    model, tokenizer = tiny_llama(seed=11, vocab_size=24)
    gen = SpeculativeGenerator(model, tokenizer, n=5, prefix_len=2)
    limit = gen.context_window
    res = gen.generate([5, 6, 7] * ((limit - 1) // 3) + [5] * ((limit - 1) % 3),
                       max_new_tokens=50)
    assert len(res.token_ids) == 1 and res.finish_reason in ("length", "eos")
    with pytest.raises(ValueError, match="context window"):
        gen.generate([5] * limit, max_new_tokens=1)


def test_trie_memory_stays_bounded_under_a_long_stream() -> None:
    import tracemalloc

    max_tokens, chunk, chunks = 10_000, 97, scale(200, 2_000)
    tracemalloc.start()  # NumPy reports its buffers to tracemalloc
    try:
        before = tracemalloc.get_traced_memory()[0]
        trie = NGramTrie(n=13, prefix_len=3, max_tokens=max_tokens)
        rng = np.random.default_rng(0)
        for _ in range(chunks):
            trie.extend(rng.integers(0, 128_256, chunk))
            trie.draft(rng.integers(0, 128_256, 3), num_draft=16)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert trie.num_tokens <= max_tokens
    assert trie.evicted_tokens == chunk * chunks - trie.num_tokens  # the rest was dropped
    assert held <= 4 * max_tokens * 8  # int64 slots: the store does not grow with the stream


def test_many_generations_release_memory(generator) -> None:
    import gc
    import tracemalloc

    tracemalloc.start()
    for _ in range(3):
        generator.generate(QUESTION, ["warm up " * 50], max_new_tokens=4)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(scale(10, 60)):
        generator.generate(QUESTION, [f"document {i} " * 300], max_new_tokens=4)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 5_000_000  # no per-request state kept (bytes, Python allocations)
