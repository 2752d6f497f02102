"""One reader per file format, each returning ``SourceDocument`` objects or raising a one-line
``DocumentLoadError`` that names the file.

Only the standard library and pypdf are used: HTML is stripped with ``html.parser`` (no
BeautifulSoup), so the retrieval extra stays small.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

from .errors import DocumentLoadError
from .jsonl import JsonlError, jsonl_rows
from .passage import SourceDocument

TEXT_FIELDS = ("text", "contents")


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DocumentLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc


def read_utf8(path: Path) -> str:
    """Decode strictly: silently replacing bytes would index garbage the user never sees."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentLoadError(
            f"cannot decode {path} as UTF-8 (invalid byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); convert it to UTF-8 text"
        ) from exc


def read_text(path: Path) -> list[SourceDocument]:
    """.txt / .md / .rst: the file is the document (markup is harmless to embeddings)."""
    return [SourceDocument(text=read_utf8(path), source=str(path))]


class _TextExtractor(HTMLParser):
    """Collects visible text; block tags become line breaks so words do not glue together."""

    SKIP = {"script", "style", "noscript", "template", "svg"}
    BLOCK = {
        "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
        "footer", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "title", "hr",
    }

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.SKIP:
            self._skip_depth += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Visible text of an HTML page, whitespace tidied, one block per line."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


def read_html(path: Path) -> list[SourceDocument]:
    return [SourceDocument(text=html_to_text(read_utf8(path)), source=str(path))]


def read_pdf(path: Path) -> list[SourceDocument]:
    """Text layer of every page; scanned PDFs have none and end up as 'empty document'."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(str(path))
        pages = [page.extract_text() or "" for page in reader.pages]
    except OSError as exc:
        raise DocumentLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (PyPdfError, ValueError, KeyError, TypeError) as exc:
        raise DocumentLoadError(f"cannot read PDF {path}: {exc}") from exc
    return [SourceDocument(text="\n\n".join(pages), source=str(path),
                           metadata={"pages": len(pages)})]


def _record_document(record: object, path: Path, where: str, index: int) -> SourceDocument:
    """One JSON record -> SourceDocument: a string, or an object with a text/contents field."""
    if isinstance(record, str):
        return SourceDocument(text=record, source=str(path), id=f"{path}:{index}")
    if isinstance(record, dict):
        for key in TEXT_FIELDS:
            if isinstance(record.get(key), str):
                rec_id = record.get("id", index)
                meta = {"record": index, "id": rec_id}
                if isinstance(record.get("title"), str):
                    meta["title"] = record["title"]
                return SourceDocument(
                    text=record[key], source=str(path), metadata=meta, id=f"{path}:{rec_id}"
                )
    raise DocumentLoadError(
        f"{path} {where} has no string field {' or '.join(map(repr, TEXT_FIELDS))}"
    )


def read_json(path: Path) -> list[SourceDocument]:
    """A JSON list of records (or one record); each record is one document."""
    try:
        data = json.loads(read_utf8(path))
    except json.JSONDecodeError as exc:
        raise DocumentLoadError(f"invalid JSON in {path}: {exc}") from exc
    records = data if isinstance(data, list) else [data]
    return [
        _record_document(rec, path, f"record {i}", i) for i, rec in enumerate(records)
    ]


def read_jsonl(path: Path) -> list[SourceDocument]:
    """One JSON record per line (blank lines skipped), e.g. DPR/FlashRAG passage dumps."""
    docs: list[SourceDocument] = []
    try:
        for line_no, record in jsonl_rows(read_utf8(path).splitlines(), path):
            docs.append(_record_document(record, path, f"line {line_no}", len(docs)))
    except JsonlError as exc:
        raise DocumentLoadError(
            f"invalid JSON in {path} line {exc.line_no}: {exc.reason}") from exc
    return docs


READERS: dict[str, Callable[[Path], list[SourceDocument]]] = {
    ".txt": read_text,
    ".md": read_text,
    ".markdown": read_text,
    ".rst": read_text,
    ".html": read_html,
    ".htm": read_html,
    ".pdf": read_pdf,
    ".json": read_json,
    ".jsonl": read_jsonl,
}

SUPPORTED_SUFFIXES: tuple[str, ...] = tuple(sorted(READERS))
