"""`ngram-trie-rag ask`: a real answer with sources, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ngram_trie_rag.commands.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"


def test_ask_answers_with_cited_sources(tmp_path: Path, capsys) -> None:
    code = main(["ask", str(SAMPLE), "What does error code E2 mean on the Aurora K3?",
                 "--json", "--rerank", "none", "--max-new-tokens", "24",
                 "--cache-dir", str(tmp_path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["answer"] and out["tokens"] > 0
    assert out["sources"] and all(s in {p.name for p in SAMPLE.iterdir()} for s in out["sources"])
    # The answer restates the manual's entry, drafted from the retrieved passages.
    assert out["mean_accept_length"] > 1.0
    assert out["tokens"] - 1 > out["steps"]  # fewer verification forwards than tokens


QUESTION = "What does error code E2 mean on the Aurora K3?"
TIMINGS = {"load", "index", "retrieve", "rerank", "prefill", "decode", "time_to_first_token",
           "total"}


def _ask_json(capsys, tmp_path: Path, *flags: str, question: str = QUESTION) -> dict:
    code = main(["ask", str(SAMPLE), question, "--json", "--cache-dir", str(tmp_path / "cache"),
                 *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


def test_default_rerank_is_cheap_and_named_and_stages_are_timed(tmp_path: Path, capsys,
                                                                monkeypatch) -> None:
    from ngram_trie_rag.retrieval import llm_reranker

    def refuse(*args, **kwargs) -> None:
        raise AssertionError("the default must not load the LLM reranker")

    monkeypatch.setattr(llm_reranker.LLMReranker, "__init__", refuse)
    out = _ask_json(capsys, tmp_path, "--max-new-tokens", "8",
                    "--cross-encoder", str(tmp_path / "no-such-cross-encoder"))
    # auto without a cross-encoder on the machine: the embedding order, no error
    assert out["reranker"] == "embedding"
    assert out["repetition_stop"] == 12
    assert out["engine"] == "eager"  # the engine that ran the answer
    assert set(out["timings"]) == TIMINGS
    assert all(isinstance(v, float) and v >= 0 for v in out["timings"].values())
    assert out["timings"]["total"] >= out["timings"]["load"] + out["timings"]["index"]


def test_auto_takes_a_cross_encoder_that_is_on_the_machine(tmp_path: Path, capsys) -> None:
    from retrieval_support import build_tiny_cross_encoder

    folder = build_tiny_cross_encoder(tmp_path / "ce")
    out = _ask_json(capsys, tmp_path, "--max-new-tokens", "4", "--cross-encoder", str(folder))
    assert out["reranker"] == f"cross-encoder {folder}"
    (tmp_path / "broken").mkdir()  # a folder, but no model in it: auto falls back quietly
    out = _ask_json(capsys, tmp_path, "--max-new-tokens", "4",
                    "--cross-encoder", str(tmp_path / "broken"))
    assert out["reranker"] == "embedding"


def test_human_summary_names_the_reranker_and_verbose_prints_timings(tmp_path: Path,
                                                                      capsys) -> None:
    code = main(["ask", str(SAMPLE), QUESTION, "--rerank", "lexical", "--verbose",
                 "--max-new-tokens", "8", "--cache-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = captured.out.strip().splitlines()[-1]
    assert summary.startswith("[accepted length") and "reranker: lexical" in summary
    err = captured.err.strip().splitlines()
    assert "reranking: lexical" in err
    assert err[-1].startswith("timings: load ") and "time to first token" in err[-1]


LOOPING = "How does the trie pick draft tokens?"  # the packaged model loops on this one


def test_the_repetition_stop_cuts_a_loop_by_default_and_can_be_turned_off(
        tmp_path: Path, capsys) -> None:
    flags = ("--rerank", "none", "--max-new-tokens", "64")
    cut = _ask_json(capsys, tmp_path, *flags, question=LOOPING)
    full = _ask_json(capsys, tmp_path, *flags, "--no-repetition-stop", question=LOOPING)
    assert cut["finish_reason"] == "repetition" and cut["repetition_stop"] == 12
    assert full["finish_reason"] == "length" and full["repetition_stop"] is None
    assert full["answer"].startswith(cut["answer"]) and full["tokens"] > cut["tokens"]
    # the accepted length describes the kept answer: its steps made its tokens
    assert cut["mean_accept_length"] * cut["steps"] == pytest.approx(cut["tokens"] - 1, abs=0.01)


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]  # progress lines may come first; the error is one line
    assert last.startswith("error: ")
    return last


@pytest.mark.parametrize(("flags", "word"), [
    (["--rerank", "vibes"], "invalid choice"),
    (["--repetition-stop", "1"], "at least 2"),
    (["--repetition-stop", "x"], "integer"),
    (["--repetition-stop", "4", "--no-repetition-stop"], "not allowed"),
    (["--verbose=yes"], "--verbose"),
])
def test_bad_flags_are_one_line_usage_errors(flags: list[str], word: str, capsys) -> None:
    assert main(["ask", str(SAMPLE), "q?", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and word in err, err


@pytest.mark.parametrize("case", ["missing", "empty_folder", "unsupported", "empty_question",
                                  "no_question", "undecodable", "bad_model"])
def test_errors_are_one_line(case: str, tmp_path: Path, capsys) -> None:
    cache = ["--cache-dir", str(tmp_path / "cache"), "--rerank", "none"]
    if case == "missing":
        err = _one_line_error(capsys, ["ask", str(tmp_path / "nope"), "q?", *cache])
        assert "no such file" in err
    elif case == "empty_folder":
        (tmp_path / "docs").mkdir()
        _one_line_error(capsys, ["ask", str(tmp_path / "docs"), "q?", *cache])
    elif case == "unsupported":
        (tmp_path / "data.xyz").write_text("hello")
        err = _one_line_error(capsys, ["ask", str(tmp_path / "data.xyz"), "q?", *cache])
        assert ".txt" in err or "supported" in err
    elif case == "empty_question":
        err = _one_line_error(capsys, ["ask", str(SAMPLE), "  ", *cache])
        assert "question is empty" in err
    elif case == "no_question":
        err = _one_line_error(capsys, ["ask", str(SAMPLE), *cache])
        assert "question" in err
    elif case == "undecodable":
        (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\x00\x81" * 64)
        _one_line_error(capsys, ["ask", str(tmp_path / "bad.txt"), "q?", *cache])
    else:
        err = _one_line_error(capsys, ["ask", str(SAMPLE), "q?", "--model",
                                       str(tmp_path / "no-model"), *cache])
        assert "does not exist" in err


def test_demo_finds_the_bundled_documents() -> None:
    from ngram_trie_rag.commands.demo import sample_docs_dir

    assert sorted(p.suffix for p in sample_docs_dir().iterdir() if p.is_file())


def test_a_chat_follow_up_keeps_the_shared_passages_first_and_reuses_their_cache(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """Passages the previous prompt had lead the follow-up's prompt in the same order, so
    the engine prefills only from the first new passage or the question on."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(
        f"{QUESTION}\nWhat should I do when the Aurora K3 shows E2?\n"))
    # The eager engine: chat's default, auto, would start compiling in the background after
    # the first answer, minutes of work this test does not need.
    code = main(["chat", str(SAMPLE), "--json", "--max-new-tokens", "8", "--engine", "eager",
                 "--cache-dir", str(tmp_path / "cache")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # each answer's line follows the "> " prompt of input()
    first, second = (json.loads(line[line.index("{"):])
                     for line in captured.out.splitlines() if "{" in line)
    before = [p["text"] for p in first["passages"]]
    after = [p["text"] for p in second["passages"]]
    shared = [t for t in after if t in before]
    assert shared, "the follow-up should retrieve some of the same passages"
    assert after[: len(shared)] == sorted(shared, key=before.index)
    # The first question may find the cache an earlier ask in this process left (the
    # process keeps one model per settings, as a resident worker does); the follow-up
    # reuses what it shares with the first.
    assert second["prefix_reused"] > 0


def test_follow_order_is_stable_for_new_passages() -> None:
    from types import SimpleNamespace

    from ngram_trie_rag.commands.ask import follow_order

    passages = [SimpleNamespace(text=t) for t in ("d", "b", "e", "a")]
    order = follow_order(passages, ["a", "b", "c"])
    assert [p.text for p in order] == ["a", "b", "d", "e"]
