"""Benchmark rows: read JSONL files of several public shapes into one prompt form.

Each row becomes a :class:`BenchItem`: the user message sent through the chat
template (a model without one gets the row's completion form, see
:meth:`BenchItem.request`), and the texts the drafter copies from. Two kinds of rows exist:

- Spec-Bench (``turns[0]``): the prompt already holds everything, so the prompt itself
  is the draft source (``documents`` is ``None``).
- Context QA (``context`` + ``question``, ``docs`` + ``query``, ``ctxs`` + ``question``):
  the documents are the draft source, kept separate from the prompt, and the prompt is
  built from them with :func:`ngram_trie_rag.prompts.rag_prompt`, the template the CLI,
  the demo and the integrations' examples use. Context QA fields win over ``turns``
  when a row has both, so that drafting uses the documents.

Gold answers, when a row has them, let the benchmark score answer quality: ``answers``
(a list of strings, as in NQ-open) or ``reference`` (Spec-Bench: a list of strings, or
of lists of strings, flattened).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..prompts import RagRequest, rag_prompt, rag_request, user_prompt

EXPECTED_SHAPES = (
    "'turns' (Spec-Bench: turns[0] is the whole prompt)",
    "'context' (str, passages split on blank lines) + 'question'",
    "'docs' (list of str) + 'query'",
    "'ctxs' (list of {'title', 'text'}) + 'question'",
)


class DataFormatError(ValueError):
    """A row (or file) that matches none of the supported shapes."""


@dataclass(frozen=True)
class BenchItem:
    """One prompt of a benchmark, independent of the file shape it came from."""

    id: str
    text: str  # the user message
    documents: list[str] | None  # draft sources; None drafts from the prompt itself
    shape: str  # "spec_bench", "context", "docs" or "ctxs"
    answers: tuple[str, ...] | None = None  # gold answers, to score quality; None if none
    question: str | None = None  # context-QA rows: the question ``text`` was built from
    note: str = ""  # a further instruction after the question (``with_instruction``)

    def with_instruction(self, instruction: str) -> BenchItem:
        """The row with ``instruction`` (e.g. an answer format) added after its text."""
        return replace(self, text=f"{self.text}\n\n{instruction}",
                       note=f"{self.note}\n\n{instruction}" if self.note else instruction)

    def request(self, tokenizer: Any) -> RagRequest:
        """The prompt in the model's form. A context-QA row is rebuilt by
        :func:`~ngram_trie_rag.prompts.rag_request` (for a chat model, the same message as
        ``text``; for a base model, the completion prompt and its stop strings); any other
        row is its text, through the chat template when the model has one."""
        if self.question is not None and self.documents is not None:
            return rag_request(tokenizer, self.documents, self.question, self.note)
        return RagRequest(user_prompt(tokenizer, self.text))


def split_context(context: str) -> list[str]:
    """A ``context`` string holds passages separated by blank lines (as in HAGRID)."""
    return [p.strip() for p in context.split("\n\n") if p.strip()]


def parse_row(row: Any, where: str = "row", index: int = 0) -> BenchItem:
    """One decoded JSON row -> :class:`BenchItem`; raises :class:`DataFormatError`.

    The id is the row's ``question_id`` or ``id``, else its position in the file."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    rid = str(row.get("question_id", row.get("id", index)))
    return replace(_item(row, rid, where), answers=_answers(row, where))


def _item(row: dict, rid: str, where: str) -> BenchItem:
    """The prompt and draft source, by the row's shape (gold answers are added apart)."""
    if "context" in row and "question" in row:
        docs = split_context(_text(row, "context", where))
        return _qa_item(rid, docs, _text(row, "question", where), "context", where)
    if "docs" in row and "query" in row:
        docs = [_as_text(d, f"{where}: docs[{i}]") for i, d in enumerate(_list(row, "docs", where))]
        return _qa_item(rid, docs, _text(row, "query", where), "docs", where)
    if "ctxs" in row and "question" in row:
        ctxs = _list(row, "ctxs", where)
        docs = [_ctx_text(c, f"{where}: ctxs[{i}]") for i, c in enumerate(ctxs)]
        return _qa_item(rid, docs, _text(row, "question", where), "ctxs", where)
    if "turns" in row:
        turns = _list(row, "turns", where)
        if not turns:
            raise DataFormatError(f"{where}: 'turns' is empty")
        text = _as_text(turns[0], f"{where}: turns[0]")
        return BenchItem(rid, text, None, "spec_bench")
    raise DataFormatError(
        f"{where}: unknown row shape with keys {sorted(row)}; expected one of: "
        + "; ".join(EXPECTED_SHAPES)
    )


def load_items(path: str | Path, limit: int | None = None) -> list[BenchItem]:
    """The first ``limit`` rows of a JSONL file (``.jsonl`` or ``.jsonl.gz``)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    items = []
    for where, row in _rows(Path(path)):
        items.append(parse_row(row, where, index=len(items)))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise DataFormatError(f"{path}: no rows")
    return items


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"data file {str(path)!r} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{where}: not valid JSON ({e.msg})") from e


def _answers(row: dict, where: str) -> tuple[str, ...] | None:
    """Gold answers from ``answers`` or ``reference``; nested lists are flattened."""
    key = "answers" if "answers" in row else "reference" if "reference" in row else None
    if key is None:
        return None
    golds = []
    for i, value in enumerate(_list(row, key, where)):
        parts = value if isinstance(value, list) else [value]
        for j, part in enumerate(parts):
            at = f"{where}: {key}[{i}]" + (f"[{j}]" if isinstance(value, list) else "")
            golds.append(_as_text(part, at))
    if not golds:
        raise DataFormatError(f"{where}: {key!r} holds no answer")
    return tuple(golds)


def _qa_item(rid: str, docs: list[str], question: str, shape: str, where: str) -> BenchItem:
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise DataFormatError(f"{where}: no non-empty documents")
    return BenchItem(rid, rag_prompt(docs, question), docs, shape, question=question)


def _text(row: dict, key: str, where: str) -> str:
    return _as_text(row[key], f"{where}: {key!r}")


def _as_text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataFormatError(f"{where} must be a non-empty string")
    return value


def _list(row: dict, key: str, where: str) -> list:
    value = row[key]
    if not isinstance(value, list):
        raise DataFormatError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    return value


def _ctx_text(ctx: Any, where: str) -> str:
    """A retrieved passage: ``{'title', 'text'}`` -> "title\\ntext" (or a plain string)."""
    if isinstance(ctx, str):
        return _as_text(ctx, where)
    if not isinstance(ctx, dict) or "text" not in ctx:
        raise DataFormatError(f"{where} must be a string or an object with 'text'")
    text = _as_text(ctx["text"], f"{where}.text")
    title = ctx.get("title")
    return f"{title}\n{text}" if isinstance(title, str) and title.strip() else text
