"""Exceptions of the retrieval package.

Every failure a user can cause (a bad path, a file we cannot read, an index built with
another embedder, a corrupted index) is one of these, so the CLI can print one line and
exit 2 instead of a traceback. They subclass ``ValueError`` because the cause is the
input, not a bug.
"""

from __future__ import annotations


class RetrievalError(ValueError):
    """Base class: a retrieval input (documents, index, factory) is not usable."""


class DocumentLoadError(RetrievalError):
    """A document path is missing, unsupported, unreadable, undecodable or empty."""


class IndexBuildError(RetrievalError):
    """A FAISS index cannot be built: bad factory string, too few training vectors."""


class IndexLoadError(RetrievalError):
    """A saved index cannot be loaded: missing/corrupted file, other embedder, version."""


class IndexSaveError(RetrievalError):
    """An index cannot be saved where asked (e.g. the target is a non-index folder)."""


class ModelLoadError(RetrievalError):
    """An embedder or cross-encoder cannot be loaded from its name or path (offline)."""
