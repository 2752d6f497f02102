"""JSON Lines: one JSON value per line, blank lines skipped.

Passage corpora, document files and saved indexes are all JSONL. They are parsed here
alone, so a bad line is reported the same way wherever it is read: the file and its
1-based line number. Callers turn :class:`JsonlError` into their own error type where
they have one (a document file's ``DocumentLoadError``, an index's ``IndexLoadError``).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class JsonlError(ValueError):
    """A line of a JSONL file that is not JSON; names the file and the line."""

    def __init__(self, source: str | Path, line_no: int, reason: str) -> None:
        super().__init__(f"{source}:{line_no}: not JSON ({reason})")
        self.source = str(source)
        self.line_no = line_no
        self.reason = reason


def jsonl_rows(lines: Iterable[str], source: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of ``lines``, read from
    ``source`` (named in errors). A line that is not JSON raises :class:`JsonlError`."""
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise JsonlError(source, line_no, err.msg) from None
        yield line_no, value


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """:func:`jsonl_rows` of a UTF-8 file, gzip-compressed when its name ends in ``.gz``.
    A missing file raises ``FileNotFoundError``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        yield from jsonl_rows(fh, path)
