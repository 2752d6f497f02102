"""The ``index`` subcommand, driven through the command line's own ``main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ngram_trie_rag.commands.cli import main

SAMPLE_DOCS = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"


pytestmark = pytest.mark.usefixtures("one_thread")


def run_cli(argv: list[str]) -> int:
    return main(argv)


@pytest.fixture(scope="module")
def built_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "index"
    assert run_cli(["index", "build", str(SAMPLE_DOCS), "--out", str(out)]) == 0
    return out


def test_build_writes_an_index(built_index: Path) -> None:
    manifest = json.loads((built_index / "manifest.json").read_text())
    assert manifest["factory"] == "Flat" and manifest["count"] >= 20
    assert manifest["embedder"] == "sentence-transformers/all-MiniLM-L6-v2"


def test_query_json_finds_the_right_document(
    built_index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    question = "How often should the Aurora K3 espresso machine be descaled?"
    assert run_cli(["index", "query", str(built_index), question, "--k", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["source"].endswith("aurora_k3_manual.txt")
    assert "descale" in rows[0]["text"].lower()
    assert rows[0]["score"] >= rows[1]["score"] >= rows[2]["score"]


def test_query_text_output(built_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    question = "What position id does a node of the draft tree get?"
    assert run_cli(["index", "query", str(built_index), question, "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("1. score ") and "tree_attention.md" in out.splitlines()[0]
    assert "\n2. score " in out


def test_query_with_llm_rerank(built_index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    question = "What does error code E2 mean on the Aurora K3?"
    argv = ["index", "query", str(built_index), question, "--k", "2", "--top-k", "6",
            "--rerank", "llm", "--json"]
    assert run_cli(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2
    assert all("retrieval_score" in r["metadata"] for r in rows)


def test_build_options(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text(" ".join(f"word{i}" for i in range(300)), encoding="utf-8")
    out = tmp_path / "idx"
    argv = ["index", "build", str(docs), "--out", str(out), "--chunk-size", "50",
            "--overlap", "0", "--factory", "Flat"]
    assert run_cli(argv) == 0
    assert json.loads((out / "manifest.json").read_text())["count"] == 6


def _expect_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    return lines[0]


def test_errors_are_one_line_exit_2(
    tmp_path: Path, built_index: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "idx")
    assert "not found" in _expect_usage_error(
        ["index", "build", str(tmp_path / "missing"), "--out", out], capsys
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no supported documents" in _expect_usage_error(
        ["index", "build", str(empty), "--out", out], capsys
    )
    assert "cannot be trained" in _expect_usage_error(
        ["index", "build", str(SAMPLE_DOCS), "--out", out, "--factory", "IVF256,PQ16"], capsys
    )
    assert "overlap" in _expect_usage_error(
        ["index", "build", str(SAMPLE_DOCS), "--out", out, "--chunk-size", "10",
         "--overlap", "10"], capsys
    )
    assert "cannot load embedder" in _expect_usage_error(
        ["index", "build", str(SAMPLE_DOCS), "--out", out, "--embedder", str(tmp_path)], capsys
    )
    assert "index not found" in _expect_usage_error(
        ["index", "query", str(tmp_path / "nope"), "question"], capsys
    )
    assert "refusing" in _expect_usage_error(
        ["index", "build", str(SAMPLE_DOCS), "--out", str(SAMPLE_DOCS)], capsys
    )
    assert "needs an action" in _expect_usage_error(["index"], capsys)
