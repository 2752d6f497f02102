"""Passage corpus files: DPR TSV and JSONL shapes, deduplication, clear errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ngram_trie_rag.retrieval.corpus import PassageCorpus, read_passages
from ngram_trie_rag.retrieval.jsonl import JsonlError, read_jsonl


def test_tsv_jsonl_and_gzip_shapes(tmp_path: Path) -> None:
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text('id\ttext\ttitle\n7\t"Paris is the capital."\t"France"\n')
    pyserini = tmp_path / "wiki.jsonl.gz"
    with gzip.open(pyserini, "wt") as fh:
        fh.write(json.dumps({"id": "w1", "contents": '"Rome"\nRome is in Italy.'}) + "\n\n")
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"text": "No title or id."}) + "\n")
    assert list(read_passages(tsv)) == [("7", "France", "Paris is the capital.")]
    assert list(read_passages(pyserini)) == [("w1", "Rome", "Rome is in Italy.")]
    assert list(read_passages(plain)) == [("0", "", "No title or id.")]


def test_duplicates_resolve_to_the_first_id(tmp_path: Path) -> None:
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tGold  text\tT\n2\tOther\tU\n")
    corpus = PassageCorpus()
    corpus.add_file(tsv)
    assert corpus.add("gold:0", "T", "gold text", "gold") == "psgs:1"  # normalised equal
    assert corpus.add("gold:1", "V", "new gold", "gold") == "gold:1"
    assert [p.id for p in corpus.passages] == ["psgs:1", "psgs:2", "gold:1"]
    assert corpus.passages[0].text == "T\nGold  text"
    assert corpus.id_of("OTHER") == "psgs:2" and corpus.id_of("absent") is None
    assert len(corpus) == 3


@pytest.mark.parametrize(("name", "content", "message"), [
    ("bad.jsonl", "{not json\n", r"bad.jsonl:1: not JSON"),
    ("bad.jsonl", '{"id": 1}\n', r"bad.jsonl:1: needs a string 'contents' or 'text'"),
    ("bad.jsonl", "[1, 2]\n", r"bad.jsonl:1: expected an object, got list"),
    ("bad.tsv", "id\ttext\ttitle\n1\tonly text\n", r"bad.tsv:2: expected id, text, title"),
])
def test_malformed_rows_name_file_and_line(tmp_path: Path, name: str, content: str,
                                           message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        PassageCorpus().add_file(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such passage file"):
        list(read_passages(tmp_path / "absent.tsv"))


def test_jsonl_rows_keep_their_line_numbers(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl.gz"
    with gzip.open(rows, "wt") as fh:
        fh.write('{"a": 1}\n\n  \n[2, 3]\n"text"\n')
    assert list(read_jsonl(rows)) == [(1, {"a": 1}), (4, [2, 3]), (5, "text")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n\n{"b": \n')
    with pytest.raises(JsonlError, match=r"bad.jsonl:3: not JSON \(Expecting value\)") as err:
        list(read_jsonl(bad))
    assert err.value.line_no == 3 and err.value.source == str(bad)
