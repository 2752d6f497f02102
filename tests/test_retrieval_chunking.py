"""Document loading (every format, every error message) and chunking."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngram_trie_rag.retrieval import (
    DocumentLoadError,
    chunk_documents,
    chunk_text,
    load_documents,
)
from ngram_trie_rag.retrieval.formats import html_to_text

SAMPLE_DOCS = Path(__file__).resolve().parents[1] / "examples" / "sample_docs"


def make_pdf(path: Path, text: str) -> Path:
    """A minimal one-page PDF with a real text layer (Helvetica), written by hand."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    path.write_bytes(bytes(out))
    return path


# --- chunking ---------------------------------------------------------------------------


def test_chunk_windows_and_overlap() -> None:
    words = [f"w{i}" for i in range(250)]
    passages = chunk_text(" ".join(words), "doc.txt", chunk_size=100, overlap=20)
    assert [p.text.split()[0] for p in passages] == ["w0", "w80", "w160"]
    assert [len(p.text.split()) for p in passages] == [100, 100, 90]
    assert [p.id for p in passages] == ["doc.txt#0", "doc.txt#1", "doc.txt#2"]
    assert all(p.source == "doc.txt" and p.score is None for p in passages)
    # Consecutive chunks share exactly `overlap` words.
    assert passages[0].text.split()[-20:] == passages[1].text.split()[:20]


def test_chunk_keeps_original_characters_and_offsets() -> None:
    text = "Line one.\nLine  two.\n\nLine three."
    (passage,) = chunk_text(text, "x", chunk_size=100, overlap=0)
    assert passage.text == text
    assert text[passage.metadata["char_start"]:passage.metadata["char_end"]] == passage.text


def test_chunk_edge_cases() -> None:
    assert chunk_text("", "x") == []
    assert chunk_text("   \n ", "x") == []
    assert len(chunk_text("a b c", "x", chunk_size=3, overlap=0)) == 1
    assert len(chunk_text("a b c d", "x", chunk_size=3, overlap=2)) == 2
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("a b", "x", chunk_size=10, overlap=10)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_text("a b", "x", chunk_size=0, overlap=0)


@settings(max_examples=60, deadline=None)
@given(
    n_words=st.integers(0, 400),
    chunk_size=st.integers(1, 120),
    overlap_fraction=st.floats(0, 0.95),
)
def test_chunk_invariants(n_words: int, chunk_size: int, overlap_fraction: float) -> None:
    overlap = min(chunk_size - 1, int(chunk_size * overlap_fraction))
    words = [f"w{i}" for i in range(n_words)]
    passages = chunk_text("  ".join(words), "s", chunk_size=chunk_size, overlap=overlap)
    chunks = [p.text.split() for p in passages]
    # Every word is covered, in order, and no chunk is longer than chunk_size.
    assert sorted({w for c in chunks for w in c}, key=lambda w: int(w[1:])) == words
    assert all(1 <= len(c) <= chunk_size for c in chunks)
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert before[-overlap:] == after[:overlap] if overlap else before[-1] != after[0]
    # No chunk lies entirely inside the previous one (no useless tail chunk).
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after[-1] not in before


# --- formats ------------------------------------------------------------------------------


def test_load_every_supported_format(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("plain text file", encoding="utf-8")
    (tmp_path / "b.md").write_text("# Title\n\nmarkdown body", encoding="utf-8")
    (tmp_path / "c.rst").write_text("Title\n=====\n\nrst body", encoding="utf-8")
    (tmp_path / "d.html").write_text(
        "<html><head><title>T</title><style>p {color: red}</style>"
        "<script>var hidden = 1;</script></head>"
        "<body><p>Hello&nbsp;<b>HTML</b> &amp; friends</p><p>second</p></body></html>",
        encoding="utf-8",
    )
    make_pdf(tmp_path / "e.pdf", "Hello PDF world")
    (tmp_path / "f.json").write_text(
        json.dumps([{"id": "r1", "text": "json record one"}, {"contents": "json two"}]),
        encoding="utf-8",
    )
    (tmp_path / "g.jsonl").write_text(
        '{"id": "7", "contents": "Title\\njsonl body"}\n\n{"text": "second line"}\n',
        encoding="utf-8",
    )
    nested = tmp_path / "sub" / "deeper"
    nested.mkdir(parents=True)
    (nested / "h.txt").write_text("nested file", encoding="utf-8")
    (tmp_path / "ignored.png").write_bytes(b"\x89PNG")
    (tmp_path / ".hidden.txt").write_text("hidden", encoding="utf-8")

    docs = load_documents(tmp_path)
    by_name = {}
    for doc in docs:
        by_name.setdefault(Path(doc.source).name, []).append(doc)
    assert sorted(by_name) == [
        "a.txt", "b.md", "c.rst", "d.html", "e.pdf", "f.json", "g.jsonl", "h.txt",
    ]
    html = by_name["d.html"][0].text
    assert "Hello HTML & friends" in html and "second" in html
    assert "hidden" not in html and "color" not in html
    assert "Hello PDF world" in by_name["e.pdf"][0].text
    assert [d.text for d in by_name["f.json"]] == ["json record one", "json two"]
    assert by_name["f.json"][0].id.endswith(":r1")
    assert [d.text for d in by_name["g.jsonl"]] == ["Title\njsonl body", "second line"]
    assert by_name["g.jsonl"][0].metadata["id"] == "7"

    passages = chunk_documents(docs)
    assert len({p.id for p in passages}) == len(passages)


def test_html_to_text_blocks() -> None:
    assert html_to_text("<ul><li>one</li><li>two</li></ul>") == "one\ntwo"


def test_sample_docs_load() -> None:
    docs = load_documents(SAMPLE_DOCS)
    assert len(docs) >= 4
    for doc in docs:
        assert 250 <= len(doc.text.split()) <= 900, doc.source


def test_load_list_of_files(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("alpha", encoding="utf-8")
    b = tmp_path / "b.md"
    b.write_text("beta", encoding="utf-8")
    assert [d.text for d in load_documents([a, str(b)])] == ["alpha", "beta"]


# --- errors: one line each, naming the problem ----------------------------------------------


def _message(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_error_path_not_found(tmp_path: Path) -> None:
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(tmp_path / "nope")
    assert "not found" in _message(excinfo)


def test_error_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(tmp_path)
    message = _message(excinfo)
    assert "no supported documents" in message and ".pdf" in message


def test_error_unsupported_format(tmp_path: Path) -> None:
    path = tmp_path / "report.docx"
    path.write_bytes(b"PK")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(path)
    message = _message(excinfo)
    assert "'.docx'" in message and "supported: " in message and ".jsonl" in message


def test_error_undecodable(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(path)
    assert "cannot decode" in _message(excinfo) and "UTF-8" in _message(excinfo)


def test_error_unreadable_file(tmp_path: Path) -> None:
    # A dangling symlink inside a folder: listed, but reading it fails (works as root too).
    os.symlink(tmp_path / "missing-target.txt", tmp_path / "broken.txt")
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(tmp_path)
    assert "cannot read" in _message(excinfo) and "broken.txt" in _message(excinfo)
    with pytest.warns(UserWarning, match="broken.txt"):
        docs = load_documents(tmp_path, on_error="skip")
    assert [d.text for d in docs] == ["fine"]


def test_error_corrupt_pdf(tmp_path: Path) -> None:
    path = tmp_path / "bad.pdf"
    path.write_bytes(b"this is not a pdf")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(path)
    assert "cannot read PDF" in _message(excinfo)


@pytest.mark.parametrize("content", ["", "   \n\t\n"])
def test_error_empty_document(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.md"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(path)
    assert "is empty" in _message(excinfo)


def test_error_json_without_text_field(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "ok"}\n{"body": "no text key"}\n', encoding="utf-8")
    with pytest.raises(DocumentLoadError) as excinfo:
        load_documents(path)
    assert "line 2" in _message(excinfo) and "'text'" in _message(excinfo)


def test_error_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "ok"}\n{not json\n', encoding="utf-8")
    with pytest.raises(DocumentLoadError, match="invalid JSON .* line 2"):
        load_documents(path)


def test_document_load_error_is_value_error() -> None:
    assert issubclass(DocumentLoadError, ValueError)
