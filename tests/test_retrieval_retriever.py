"""Retriever end to end on the bundled sample documents, and the load_or_build cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ngram_trie_rag.retrieval import (
    Embedder,
    LLMReranker,
    Passage,
    Retriever,
    load_or_build,
)
from ngram_trie_rag.retrieval.cache import cache_key

SAMPLE_DOCS = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def retriever(embedder: Embedder) -> Retriever:
    return Retriever.build(SAMPLE_DOCS, embedder=embedder)


@pytest.mark.parametrize(
    ("question", "expected_file"),
    [
        ("What is the capacity of the Aurora K3 water tank?", "aurora_k3_manual.txt"),
        ("What does error E4 mean?", "aurora_k3_troubleshooting.html"),
        ("How is the attention mask for the draft tree built?", "tree_attention.md"),
        ("Which window size n and prefix length L_p were best for Llama-2-7B?",
         "ngram_trie_speculative_decoding.md"),
        ("How many training vectors does IVF4096 need?", "retrieval_pipeline.rst"),
    ],
)
def test_retrieve_finds_the_source(retriever: Retriever, question: str, expected_file: str):
    passages = retriever.retrieve(question)
    assert len(passages) == 5
    assert Path(passages[0].source).name == expected_file
    scores = [p.score for p in passages]
    assert scores == sorted(scores, reverse=True)


def test_retrieve_batch_and_top_n(retriever: Retriever) -> None:
    batch = retriever.retrieve_batch(["water tank", "tree attention mask"], top_n=2)
    assert [len(row) for row in batch] == [2, 2]
    assert retriever.retrieve_batch([]) == []


def test_build_from_passages_and_save_load(embedder: Embedder, tmp_path: Path) -> None:
    passages = [
        Passage("a", "The capital of France is Paris.", "geo"),
        Passage("b", "Water boils at 100 degrees Celsius at sea level.", "physics"),
        Passage("c", "The cheetah is the fastest land animal.", "zoo"),
    ]
    built = Retriever.build(passages, embedder=embedder, top_n=2)
    built.save(tmp_path / "idx")
    loaded = Retriever.load(tmp_path / "idx", top_n=2)
    question = "At what temperature does water boil?"
    assert [p.id for p in loaded.retrieve(question)] == [p.id for p in built.retrieve(question)]
    assert loaded.retrieve(question)[0].id == "b"


def test_retriever_rejects_a_different_embedder(retriever: Retriever, tmp_path: Path) -> None:
    from retrieval_support import build_tiny_sentence_transformer

    other = Embedder(build_tiny_sentence_transformer(tmp_path / "tiny"))
    with pytest.raises(ValueError, match="differs"):
        Retriever(retriever.index, other)


def test_retriever_with_llm_reranker(retriever: Retriever) -> None:
    reranking = Retriever(retriever.index, reranker=LLMReranker(), top_k=8, top_n=3)
    passages = reranking.retrieve("How often should the water filter be replaced?")
    assert len(passages) == 3
    assert all("retrieval_score" in p.metadata for p in passages)
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)


def test_load_or_build_caches_and_invalidates(embedder: Embedder, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "one.md").write_text("Alpacas are domesticated camelids from South America.")
    (docs / "two.txt").write_text("The Danube flows through ten countries.")
    cache = tmp_path / "cache"

    first = load_or_build(docs, cache, embedder=embedder)
    (entry,) = cache.iterdir()
    stamp = (entry / "manifest.json").stat().st_mtime_ns
    second = load_or_build(docs, cache, embedder=embedder)
    assert (entry / "manifest.json").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert [p.id for p in second.index.passages] == [p.id for p in first.index.passages]

    # Changing a file changes the key: rebuilt, and the stale entry is removed.
    (docs / "two.txt").write_text("The Danube flows through ten countries into the Black Sea.")
    os.utime(docs / "two.txt", ns=(stamp + 10**9, stamp + 10**9))
    third = load_or_build(docs, cache, embedder=embedder)
    (new_entry,) = cache.iterdir()
    assert new_entry != entry
    assert "Black Sea" in " ".join(p.text for p in third.index.passages)


def test_cache_key_depends_on_settings(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    base = cache_key(tmp_path, "emb")
    assert cache_key(tmp_path, "emb") == base
    assert cache_key(tmp_path, "other")[1] != base[1]
    assert cache_key(tmp_path, "emb", chunk_size=50)[1] != base[1]
    assert cache_key(tmp_path, "emb")[0] == base[0]


def test_damaged_cache_entry_is_rebuilt(embedder: Embedder, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Mount Kilimanjaro is the highest mountain in Africa.")
    cache = tmp_path / "cache"
    load_or_build(docs, cache, embedder=embedder)
    (entry,) = cache.iterdir()
    (entry / "index.faiss").write_bytes(b"garbage")
    again = load_or_build(docs, cache, embedder=embedder)
    assert len(again.index) == 1
