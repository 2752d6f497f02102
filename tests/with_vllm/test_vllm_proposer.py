"""The trie proposer inside vLLM (CPU build): greedy output identical to vLLM without
speculation, with 16 requests batched, each drafting from its own documents only, and
per-request state gone once a request has finished or been aborted.

Runs in vLLM's own environment (``make test-vllm``); skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

RUN = Path(__file__).with_name("run_vllm.py")
PROMPTS = 16


def _run(model_dir: str, method: str, out: Path) -> dict:
    done = subprocess.run([sys.executable, str(RUN), model_dir, method, str(PROMPTS), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("vllm")
    return {m: _run(model_dir, m, folder / f"{m}.json") for m in ("plain", "trie")}


def test_batched_greedy_output_is_vllms_own(runs: dict[str, dict]) -> None:
    plain, trie = runs["plain"], runs["trie"]
    assert len(trie["batched"]) == PROMPTS
    assert trie["batched"] == plain["batched"]  # 16 requests at once, token for token
    assert trie["alone"] == plain["batched"]  # and each request alone


def test_each_batched_answer_is_the_answer_alone(runs: dict[str, dict]) -> None:
    trie = runs["trie"]
    assert trie["batched"] == trie["alone"]


def test_each_request_drafts_from_its_own_documents(runs: dict[str, dict]) -> None:
    trie = runs["trie"]
    documents = trie["documents"]
    assert len({json.dumps(d) for d in documents}) == PROMPTS  # all different
    # Worker ids are "{client id}-{suffix}"; client ids count up: 0..15 are the batch,
    # 16..31 the same prompts alone, 32..39 the first eight under a grammar.
    seen = {int(rid.split("-")[0]): docs for rid, docs in trie["seen"].items()
            if rid.split("-")[0].isdigit()}
    constrained = len(trie["constrained"])
    assert sorted(seen) == list(range(2 * PROMPTS + constrained))
    for client, docs in seen.items():
        assert docs == documents[client % PROMPTS], client


def test_state_ends_with_the_request(runs: dict[str, dict]) -> None:
    trie = runs["trie"]
    # vLLM tells its runner about finished requests at the next step, and the proposer
    # drops their state then: after the batch at most its last step's requests remain,
    # and once other requests ran, none of the batch's.
    after_batch = trie["state_after_batch"]["drafters"]
    assert len(after_batch) < PROMPTS
    later = trie["state_after_alone"]
    assert not set(later["drafters"]) & set(after_batch)
    assert len(later["drafters"]) <= 1 and later["rates"] == later["drafters"]
    abort = trie["abort"]
    assert abort["abort_was_drafting"]
    assert [r.split("-")[0] for r in abort["live_after_abort"]] == ["keep"]


def test_drafts_are_accepted(runs: dict[str, dict]) -> None:
    metrics = runs["trie"]["metrics"]
    assert metrics["vllm:spec_decode_num_drafts"] > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0


def test_grammar_constrained_answers_are_vllms_own(runs: dict[str, dict],
                                                   model_dir: str) -> None:
    """Under a JSON-schema grammar (vLLM's structured outputs) the trie's drafts are
    verified against the grammar: the answers equal vLLM's without speculation and are
    objects of the schema (those that ended before the token limit)."""
    from transformers import AutoTokenizer

    plain, trie = runs["plain"]["constrained"], runs["trie"]["constrained"]
    assert len(trie) == 8 and trie == plain
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    finished = [t for t in trie if t[-1] == tokenizer.eos_token_id]
    assert finished
    for tokens in finished:
        reply = json.loads(tokenizer.decode(tokens, skip_special_tokens=True))
        assert set(reply) == {"answer", "quote"}
