"""Passage corpora for open-domain QA: DPR TSV and JSONL passage files, deduplicated.

The paper's retrieval setup (and ``scripts/retrieval_eval.py``,
``examples/triviaqa_reproduction.py``) searches a Wikipedia passage corpus to which each
question's gold passage may be added. Gold passages often repeat a corpus passage, so
passages are deduplicated on their whitespace- and case-normalised text; the first id
seen for a text is the one every later duplicate resolves to, which is what recall@k
must compare against.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .jsonl import jsonl_rows
from .passage import Passage


def _open(path: Path) -> IO[str]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such passage file")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_passages(path: str | Path) -> Iterator[tuple[str, str, str]]:
    """``(id, title, text)`` of every passage in ``path`` (optionally ``.gz``).

    Shapes: DPR TSV (header ``id, text, title``); JSONL rows with ``contents``
    ("title\\ntext", Pyserini) or ``text`` and optional ``title`` and ``id`` (the line
    number when absent). A malformed row raises ``ValueError`` naming file and line
    (:class:`~ngram_trie_rag.retrieval.jsonl.JsonlError` for a line that is not JSON).
    """
    path = Path(path)
    with _open(path) as fh:
        if ".tsv" in path.suffixes:
            next(fh, None)  # header
            for line_no, line in enumerate(fh, start=2):
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 3:
                    raise ValueError(f"{path}:{line_no}: expected id, text, title separated "
                                     f"by tabs, got {len(fields)} field(s)")
                pid, text, title = fields[:3]
                yield pid, title.strip('"'), text.strip('"')
            return
        for line_no, row in jsonl_rows(fh, path):
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{line_no}: expected an object, got "
                                 f"{type(row).__name__}")
            if isinstance(row.get("contents"), str):
                title, _, text = row["contents"].partition("\n")
            elif isinstance(row.get("text"), str):
                title, text = str(row.get("title") or ""), row["text"]
            else:
                raise ValueError(f"{path}:{line_no}: needs a string 'contents' or 'text'")
            yield str(row.get("id", line_no - 1)), title.strip('"'), text


def _key(text: str) -> str:
    return " ".join(text.split()).lower()


class PassageCorpus:
    """Passages embedded as "title\\ntext", one per distinct normalised text."""

    def __init__(self) -> None:
        self.passages: list[Passage] = []
        self._ids: dict[str, str] = {}  # normalised text -> id of its first passage

    def __len__(self) -> int:
        return len(self.passages)

    def add(self, pid: str, title: str, text: str, source: str) -> str:
        """Add a passage unless its text is already in; returns the id that text has."""
        key = _key(text)
        if key not in self._ids:
            self._ids[key] = pid
            self.passages.append(Passage(pid, f"{title}\n{text}", source))
        return self._ids[key]

    def add_file(self, path: str | Path, prefix: str | None = None) -> None:
        """Every passage of ``path``, ids ``"{prefix}:{id}"`` (prefix: the file's stem)."""
        path = Path(path)
        prefix = path.name.split(".")[0] if prefix is None else prefix
        for pid, title, text in read_passages(path):
            self.add(f"{prefix}:{pid}", title, text, path.name)

    def id_of(self, text: str) -> str | None:
        """The id of the passage holding ``text`` (normalised), or None."""
        return self._ids.get(_key(text))
