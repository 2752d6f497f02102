"""Rerankers: the LLM reranker with the project's default model (both scoring methods),
and the CrossEncoder path with a tiny offline-built model (or a real one if configured)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from retrieval_support import build_tiny_cross_encoder

from ngram_trie_rag.retrieval import CrossEncoderReranker, LLMReranker, Passage, Reranker

IRRELEVANT = [
    "The mitochondrion is the organelle that produces most of the energy of a cell.",
    "A football team has eleven players on the field, including one goalkeeper.",
    "Photosynthesis turns sunlight, water and carbon dioxide into glucose and oxygen.",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def candidates(relevant: str, position: int) -> list[Passage]:
    texts = list(IRRELEVANT)
    texts.insert(position, relevant)
    return [
        Passage(id=f"p{i}", text=t, source="test", score=1.0 - 0.1 * i)
        for i, t in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from ngram_trie_rag.loading import load_model

    return load_model()


@pytest.fixture(scope="module")
def llm_reranker(model_and_tokenizer) -> LLMReranker:
    model, tokenizer = model_and_tokenizer
    return LLMReranker(model, tokenizer, batch_size=4)


@pytest.mark.parametrize(
    ("query", "relevant", "position"),
    [
        ("What is the capital of France?",
         "Paris is the capital and largest city of France, on the river Seine.", 3),
        ("How many legs does a spider have?",
         "Spiders are arachnids: they have eight legs and two body segments.", 1),
        ("Who painted the Mona Lisa?",
         "The Mona Lisa is a portrait painted by Leonardo da Vinci in the early 1500s.", 2),
    ],
)
def test_llm_reranker_puts_the_relevant_passage_first(
    llm_reranker: LLMReranker, query: str, relevant: str, position: int
) -> None:
    assert llm_reranker.method == "query_likelihood"
    ranked = llm_reranker.rerank(query, candidates(relevant, position), top_n=4)
    assert ranked[0].text == relevant
    assert [p.score for p in ranked] == sorted((p.score for p in ranked), reverse=True)
    assert ranked[0].metadata["retrieval_score"] == pytest.approx(1.0 - 0.1 * position)


@pytest.mark.parametrize("method", ["query_likelihood", "yes_no"])
def test_llm_reranker_batching_does_not_change_scores(model_and_tokenizer, method: str) -> None:
    model, tokenizer = model_and_tokenizer
    reranker = LLMReranker(model, tokenizer, method=method, batch_size=8)
    query = "What is the capital of France?"
    texts = ["Paris is the capital of France.", IRRELEVANT[0], "A much longer passage " * 12]
    batched = reranker.score(query, texts)  # one left-padded batch of three lengths
    single = np.array([reranker.score(query, [t])[0] for t in texts])
    assert np.isfinite(batched).all()
    np.testing.assert_allclose(batched, single, atol=2e-3)


def test_llm_reranker_contract(llm_reranker: LLMReranker) -> None:
    assert isinstance(llm_reranker, Reranker)
    assert llm_reranker.rerank("q", [], top_n=5) == []
    assert len(llm_reranker.rerank("a question", candidates("x", 0)[:3], top_n=2)) == 2
    prompt = llm_reranker.build_prompt("Who?", "word " * 1000)
    assert prompt.endswith("Question:") and len(llm_reranker.tokenizer.encode(prompt)) < 300
    model, tokenizer = llm_reranker.model, llm_reranker.tokenizer
    yes_no = LLMReranker(model, tokenizer, method="yes_no")
    assert yes_no.build_prompt("Who?", "Me.").endswith("Answer yes or no.\nAnswer:")
    with pytest.raises(ValueError, match="both model and tokenizer"):
        LLMReranker(model, None)
    with pytest.raises(ValueError, match="method"):
        LLMReranker(model, tokenizer, method="vibes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\{query\}"):
        LLMReranker(model, tokenizer, method="yes_no", prompt="Passage: {passage}")
    with pytest.raises(ValueError, match="top_n"):
        llm_reranker.rerank("q", candidates("x", 0), top_n=0)


def test_cross_encoder_reranker_with_tiny_model(tmp_path: Path) -> None:
    reranker = CrossEncoderReranker(build_tiny_cross_encoder(tmp_path / "ce"), batch_size=2)
    passages = candidates("Paris is the capital of France.", 1)
    ranked = reranker.rerank("capital of France", passages, top_n=3)
    assert len(ranked) == 3 and isinstance(reranker, Reranker)
    scores = reranker.score("capital of France", [p.text for p in passages])
    assert scores.shape == (4,)
    expected = [passages[i].id for i in np.argsort(-scores, kind="stable")[:3]]
    assert [p.id for p in ranked] == expected
    assert [p.score for p in ranked] == pytest.approx(sorted(scores, reverse=True)[:3], abs=1e-6)


@pytest.mark.skipif(
    not os.environ.get("NGRAM_TRIE_RAG_CROSS_ENCODER"),
    reason="set NGRAM_TRIE_RAG_CROSS_ENCODER to a local cross-encoder (e.g. bge-reranker-v2-m3)",
)
def test_real_cross_encoder_ranks_relevant_first() -> None:
    reranker = CrossEncoderReranker(os.environ["NGRAM_TRIE_RAG_CROSS_ENCODER"])
    relevant = "Paris is the capital and largest city of France."
    ranked = reranker.rerank("What is the capital of France?", candidates(relevant, 2), top_n=1)
    assert ranked[0].text == relevant


def test_lexical_reranker_orders_by_term_overlap() -> None:
    from ngram_trie_rag.retrieval import LexicalReranker

    texts = [
        "The warranty covers the Aurora K3 for two years from the date of purchase.",
        "Error E4: the water tank is empty. Refill the tank and press start.",
        "Error E2 means the thermoblock overheated; let the machine cool for ten minutes.",
        "Descale the machine every 200 cups with the supplied descaling liquid.",
    ]
    passages = [Passage(id=f"p{i}", text=t, source="manual", score=1.0 - 0.1 * i)
                for i, t in enumerate(texts)]
    reranker = LexicalReranker()
    assert isinstance(reranker, Reranker)
    ranked = reranker.rerank("What does error E2 mean?", passages, top_n=4)
    # E2 is rare among the candidates, "error" is not: the passage naming E2 wins.
    assert [p.id for p in ranked[:2]] == ["p2", "p1"]
    assert ranked[0].metadata["retrieval_score"] == pytest.approx(0.8)
    ranked = reranker.rerank("how often should I descale?", passages, top_n=1)
    assert ranked[0].id == "p3"
    # No shared term: every score is 0 and the stable sort keeps the retrieval order.
    ranked = reranker.rerank("photosynthesis", passages, top_n=4)
    assert [p.id for p in ranked] == ["p0", "p1", "p2", "p3"]
    assert all(p.score == 0.0 for p in ranked)


def test_lexical_reranker_scores() -> None:
    from ngram_trie_rag.retrieval import LexicalReranker

    reranker = LexicalReranker()
    assert reranker.score("q", []).shape == (0,)
    # Stopwords do not count; a repeated query term counts more, with diminishing returns.
    scores = reranker.score("the trie", ["the the the the", "trie", "trie trie trie", "x"])
    assert scores[0] == 0.0 and scores[3] == 0.0
    assert 0.0 < scores[1] < scores[2] < 3 * scores[1]
    with pytest.raises(ValueError, match="k1"):
        LexicalReranker(k1=-1.0)
