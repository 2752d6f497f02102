"""The trie proposer inside vLLM (CPU build): greedy output identical to vLLM without
speculation, with many requests batched, each drafting from its own documents.

Runs in vLLM's own environment (``make test-vllm``); skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

RUN = Path(__file__).with_name("run_vllm.py")
PROMPTS = 12


def _run(method: str, out: Path) -> dict:
    model = os.environ.get("NGRAM_TRIE_RAG_MODEL_DIR")
    if not model:
        pytest.skip("NGRAM_TRIE_RAG_MODEL_DIR names no converted model folder")
    done = subprocess.run([sys.executable, str(RUN), model, method, str(PROMPTS), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("vllm")
    return {method: _run(method, folder / f"{method}.json") for method in ("plain", "trie")}


def test_batched_greedy_output_is_vllms_own(runs: dict[str, dict]) -> None:
    plain, trie = runs["plain"], runs["trie"]
    assert len(trie["batched"]) == PROMPTS
    assert trie["batched"] == plain["batched"]  # 12 requests at once, token for token
    assert trie["alone"] == plain["alone"] == plain["batched"][0]


def test_drafts_are_accepted(runs: dict[str, dict]) -> None:
    metrics = runs["trie"]["metrics"]
    assert metrics["vllm:spec_decode_num_drafts"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
