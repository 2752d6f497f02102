"""``scripts/method_agreement.py``, the check behind the bf16 agreement figures, on the
packaged model in fp32, where every method must give ``generate``'s tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ngram_trie_rag import SpeculativeGenerator
from ngram_trie_rag.util.cache_paths import data_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = data_dir() / "spec_bench" / "rag.jsonl"
sys.path.insert(0, str(ROOT / "scripts"))

from method_agreement import agreement, first_difference  # noqa: E402


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


@pytest.mark.skipif(not DATA.is_file(), reason="needs the shared Spec-Bench data")
def test_fp32_methods_agree_with_each_other_and_with_generate() -> None:
    gen = SpeculativeGenerator.from_pretrained(dtype="float32", engine="uniform")
    summary = agreement(gen, DATA, limit=2, skip=1, max_new_tokens=12, generate=True)
    assert summary["prompts"] == 1 and summary["all_three_agree"] == 1
    assert summary["equal_to_generate"] == {"none": 1, "chain": 1, "trie": 1}
    assert summary["rows"][0]["parts_from_plain"] == {"none": None, "chain": None,
                                                      "trie": None}
