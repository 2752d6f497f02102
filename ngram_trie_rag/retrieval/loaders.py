"""``load_documents``: files or folders in, ``SourceDocument`` objects out, or one clear error.

A folder is walked recursively; hidden entries (``.git``, ``.DS_Store``) and files of other
formats are skipped quietly, because folders hold images and build files. A file named
explicitly must be of a supported format, since the user clearly meant it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from .errors import DocumentLoadError
from .formats import READERS, SUPPORTED_SUFFIXES
from .passage import SourceDocument

PathLike = str | os.PathLike


def supported_formats() -> str:
    return ", ".join(SUPPORTED_SUFFIXES)


def _as_paths(path_or_paths: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(path_or_paths, (str, os.PathLike)):
        return [Path(path_or_paths)]
    return [Path(p) for p in path_or_paths]


def _walk(folder: Path) -> list[Path]:
    """Supported files under ``folder`` in a stable (sorted) order, hidden entries skipped."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in READERS:
                found.append(Path(root) / name)
    return found


def _reachable(path: Path) -> bool:
    """Whether ``path`` exists; a path that cannot be followed (a symbolic link loop, a
    folder without permission) is a ``DocumentLoadError`` naming it, not an ``OSError``
    from deep inside a reader or the cache's fingerprint."""
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise DocumentLoadError(f"cannot read {path}: it is a symbolic link to "
                                    f"{os.readlink(path)!r}, which does not exist") from None
        return False
    except OSError as exc:
        raise DocumentLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
    return True


def discover_files(path_or_paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """Every document file that ``load_documents`` would read, validating paths and formats."""
    paths = _as_paths(path_or_paths)
    if not paths:
        raise DocumentLoadError("no document paths given")
    files: list[Path] = []
    for path in paths:
        if not _reachable(path):
            raise DocumentLoadError(f"document path not found: {path}")
        if path.is_dir():
            inside = _walk(path)
            if not inside:
                raise DocumentLoadError(
                    f"no supported documents in folder {path} (supported: {supported_formats()})"
                )
            files.extend(inside)
        elif path.suffix.lower() not in READERS:
            raise DocumentLoadError(
                f"unsupported document format {path.suffix or '(no extension)'!r} for {path} "
                f"(supported: {supported_formats()})"
            )
        else:
            files.append(path)
    return files


def _read_file(path: Path) -> list[SourceDocument]:
    docs = READERS[path.suffix.lower()](path)
    if not docs or all(not doc.text.strip() for doc in docs):
        raise DocumentLoadError(f"document {path} is empty (no text to index)")
    return [doc for doc in docs if doc.text.strip()]


def load_documents(
    path_or_paths: PathLike | Sequence[PathLike],
    *,
    on_error: Literal["raise", "skip"] = "raise",
) -> list[SourceDocument]:
    """Read .txt/.md/.rst/.html/.pdf/.json/.jsonl files and folders into documents.

    ``on_error="skip"`` turns per-file problems (unreadable, undecodable, empty) into
    warnings, for large folders where one bad file should not stop indexing; path and
    empty-folder errors always raise.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    documents: list[SourceDocument] = []
    for path in discover_files(path_or_paths):
        try:
            documents.extend(_read_file(path))
        except DocumentLoadError as exc:
            if on_error == "raise":
                raise
            warnings.warn(f"skipped: {exc}", stacklevel=2)
    if not documents:
        raise DocumentLoadError("no text found in the given documents")
    return documents


def iter_file_stats(files: Iterable[Path]) -> list[tuple[str, int, int]]:
    """(absolute path, mtime_ns, size) per file: the cheap fingerprint the index cache keys on."""
    stats = []
    for path in files:
        st = file_stat(path)
        stats.append((str(path.resolve()), st.st_mtime_ns, st.st_size))
    return stats


def file_stat(path: Path) -> os.stat_result:
    """``path.stat()``, with a file that cannot be followed (a symbolic link loop, a
    dangling link) reported as a ``DocumentLoadError`` naming it."""
    try:
        return path.stat()
    except OSError as exc:
        raise DocumentLoadError(f"cannot read {path}: {exc.strerror or exc}") from None
