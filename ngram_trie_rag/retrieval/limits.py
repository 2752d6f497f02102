"""Caps on how much a build may index, checked before the slow part starts.

Embedding is the slow part: MiniLM on two CPU cores embeds roughly 20 to 30 passages a
second, so a 20 MB text file (about 41k passages of 100 words) is half an hour of work. A
build that is handed more than the caller meant (a home folder instead of a docs folder)
should stop at once with the numbers, not after minutes. ``max_bytes`` is checked from
file sizes before anything is read, ``max_passages`` after chunking, before embedding.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .errors import RetrievalError
from .loaders import file_stat


class InputTooLargeError(RetrievalError):
    """The documents exceed a cap the caller set (``max_bytes``, ``max_passages``)."""


def human_bytes(n: int) -> str:
    """``20971520`` -> ``"20.0 MB"`` (powers of 1024, one decimal)."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def total_bytes(files: Iterable[Path]) -> int:
    """Sum of the files' sizes (``stat`` only, nothing read)."""
    return sum(file_stat(path).st_size for path in files)


def check_bytes(files: list[Path], max_bytes: int | None) -> int:
    """The files' total size; ``InputTooLargeError`` when it is over ``max_bytes``."""
    size = total_bytes(files)
    if max_bytes is not None and size > max_bytes:
        raise InputTooLargeError(
            f"the documents hold {human_bytes(size)} in {len(files)} files, over the limit "
            f"of {human_bytes(max_bytes)} (max_bytes, --max-bytes); raise the limit or "
            "index fewer files"
        )
    return size


def check_passages(count: int, max_passages: int | None) -> None:
    """``InputTooLargeError`` when ``count`` passages are over ``max_passages``."""
    if max_passages is not None and count > max_passages:
        raise InputTooLargeError(
            f"the documents make {count:,} passages, over the limit of {max_passages:,} "
            "(max_passages, --max-passages); raise the limit, index fewer files or use a "
            "larger --chunk-size"
        )
