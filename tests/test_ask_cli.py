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


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]  # progress lines may come first; the error is one line
    assert last.startswith("error: ")
    return last


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
