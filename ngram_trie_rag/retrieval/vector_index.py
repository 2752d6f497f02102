"""``VectorIndex``: passages + their normalised embeddings in a FAISS inner-product index.

Search returns cosine similarities because every vector (documents and queries) is
L2-normalised before it reaches FAISS. The index type follows ``policy.choose_factory``
unless a ``factory`` string is given; it is created (and trained, if it needs training) on
the first ``add``, so the policy sees the corpus size. Passage ``i`` is FAISS id ``i``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import batches
from .batches import Report, estimate_line, training_sample
from .embedder import Embedder
from .errors import IndexBuildError, IndexLoadError
from .gpu import GpuPlacement
from .passage import Passage
from .policy import choose_factory, default_nprobe, factory_nlist
from .store import read_index_dir, write_index_dir

# GPU FAISS limits k per query; CPU has no practical limit.
GPU_MAX_K = 2048


def _normalised(vectors: np.ndarray, dim: int) -> np.ndarray:
    """A float32 C-contiguous unit-norm copy, shape (n, dim); a 1-D vector is one row."""
    import faiss

    array = np.array(vectors, dtype=np.float32, copy=True, ndmin=2)
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"expected vectors of shape (n, {dim}), got {np.shape(vectors)}")
    array = np.ascontiguousarray(array)
    faiss.normalize_L2(array)
    return array


def _training_error(factory: str, n: int, exc: Exception | None = None) -> IndexBuildError:
    nlist = factory_nlist(factory)
    need = f"at least {nlist} (nlist) training vectors" if nlist else "more training vectors"
    detail = f" (FAISS: {str(exc).strip().splitlines()[-1]})" if exc else ""
    return IndexBuildError(
        f"factory {factory!r} cannot be trained on {n} vectors: it needs {need}, and 8-bit PQ "
        f"needs >= 256; use a smaller nlist, factory='Flat', or more data{detail}"
    )


def _disable_polysemous_training(index: Any) -> None:
    """FAISS's factory turns on polysemous training for PQ codes: a simulated-annealing
    reordering of the codes that only helps Hamming-distance pre-filtering (polysemous_ht),
    which we never use. It made IVF256,PQ64 training on 10k vectors take minutes instead of
    seconds here; the index structure and search results are otherwise the same."""
    import faiss

    inner = faiss.try_extract_index_ivf(index) or index
    inner = faiss.downcast_index(inner)
    if hasattr(inner, "do_polysemous_training"):
        inner.do_polysemous_training = False


class VectorIndex:
    """FAISS index over passages, tied to the embedder that produced its vectors."""

    def __init__(
        self,
        embedder: Embedder | None = None,
        *,
        factory: str | None = None,
        nprobe: int | None = None,
        use_gpu: bool | None = None,
    ) -> None:
        self.embedder = embedder if embedder is not None else Embedder()
        self.embedder_name: str = self.embedder.name
        self.dim: int = self.embedder.dim
        self.factory = factory
        self._nprobe = nprobe
        self._gpu = GpuPlacement(use_gpu)
        self._index: Any = None
        self._passages: list[Passage] = []
        self.manifest: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._passages)

    def __repr__(self) -> str:
        return (
            f"VectorIndex({len(self)} passages, factory={self.factory!r}, "
            f"nprobe={self.nprobe}, embedder={self.embedder_name!r})"
        )

    @property
    def passages(self) -> tuple[Passage, ...]:
        return tuple(self._passages)

    @property
    def nprobe(self) -> int | None:
        """IVF lists visited per query (recall/speed knob); None for non-IVF indexes."""
        return self._nprobe

    @nprobe.setter
    def nprobe(self, value: int | None) -> None:
        self._nprobe = value
        if self._index is not None:
            self._apply_nprobe()

    def _apply_nprobe(self) -> None:
        import faiss

        if self._nprobe is None or factory_nlist(self.factory or "") is None:
            return
        space = faiss.GpuParameterSpace() if self._gpu.is_gpu(self._index) else (
            faiss.ParameterSpace()
        )
        space.set_index_parameter(self._index, "nprobe", int(self._nprobe))

    def _create(self, n_train: int, planned: int | None = None) -> tuple[Any, str]:
        """A new empty index and its factory (policy-chosen for ``planned`` vectors, by
        default ``n_train``, when unset)."""
        import faiss

        factory = self.factory or choose_factory(planned or n_train, self.dim)
        try:
            index = faiss.index_factory(self.dim, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as exc:
            raise IndexBuildError(
                f"invalid FAISS factory string {factory!r}: {str(exc).splitlines()[-1]}"
            ) from exc
        nlist = factory_nlist(factory)
        if not index.is_trained and nlist is not None and n_train < nlist:
            raise _training_error(factory, n_train)
        _disable_polysemous_training(index)
        return self._gpu.to_device(index), factory

    def add(
        self,
        passages: Sequence[Passage],
        vectors: np.ndarray | None = None,
        *,
        progress: bool | None = None,
        report: Report | None = None,
    ) -> None:
        """Append passages; embeds them unless ``vectors`` (n, dim) are given.

        The first add creates the index and trains it when the factory needs training
        (IVF, PQ); later adds only encode and append. A failed training leaves the index
        empty and unchanged, so a larger first batch can still succeed. Passages to embed
        go in batches (see ``batches``); ``report`` gets one line with the time estimate
        before the long part.
        """
        passages = list(passages)
        if not passages:
            return
        if vectors is None:
            self._embed_and_add(passages, progress, report)
        else:
            self._add_vectors(passages, vectors, len(passages))

    def _embed_and_add(self, passages: list[Passage], progress: bool | None,
                       report: Report | None) -> None:
        """Embed batch by batch, adding each batch's vectors as they come; an index still
        to be trained first collects its training sample."""
        from tqdm.auto import tqdm

        total = len(passages)
        need = 0 if self._index is not None else self._training_need(total)
        pending: list[tuple[list[Passage], np.ndarray]] = []
        show = total > 256 if progress is None else progress
        start, bar = time.perf_counter(), None
        try:
            for lo, hi in batches.batch_bounds(total, batches.PROBE_SIZE, batches.BATCH_SIZE):
                batch = passages[lo:hi]
                pending.append((batch, self.embedder.encode([p.text for p in batch],
                                                            progress=False)))
                if bar is None:  # after the timed probe: the estimate, then the bar
                    if report is not None and hi < total:
                        report(estimate_line(total, hi, time.perf_counter() - start,
                                             self.embedder_name))
                    bar = tqdm(total=total, initial=hi, unit="passage", desc="embedding",
                               disable=not show)
                else:
                    bar.update(hi - lo)
                if sum(len(b) for b, _ in pending) >= need or hi == total:
                    self._add_vectors([p for b, _ in pending for p in b],
                                      np.concatenate([v for _, v in pending]), total)
                    pending, need = [], 0
        finally:
            if bar is not None:
                bar.close()

    def _training_need(self, planned: int) -> int:
        """Vectors the first add must bring: a training sample when the index that
        ``planned`` vectors get must be trained, else none."""
        import faiss

        factory = self.factory or choose_factory(planned, self.dim)
        try:
            trained = faiss.index_factory(self.dim, factory, faiss.METRIC_INNER_PRODUCT).is_trained
        except RuntimeError:
            return planned  # an invalid factory: the first add reports it
        return 0 if trained else training_sample(factory, planned)

    def _add_vectors(self, passages: list[Passage], vectors: np.ndarray, planned: int) -> None:
        """Add passages with their vectors; the first call creates (and trains) the index
        for ``planned`` vectors in all."""
        vectors = _normalised(vectors, self.dim)
        if len(vectors) != len(passages):
            raise ValueError(f"{len(passages)} passages but {len(vectors)} vectors")
        if self._index is None:
            index, factory = self._create(len(vectors), planned)
            if not index.is_trained:
                try:
                    index.train(vectors)
                except RuntimeError as exc:
                    raise _training_error(factory, len(vectors), exc) from exc
            # Only now, with a usable index, does the recipe become part of the state.
            self._index, self.factory = index, factory
            if self._nprobe is None:
                self._nprobe = default_nprobe(factory)
            self._apply_nprobe()
        self._index.add(vectors)
        self._passages.extend(
            Passage(p.id, p.text, p.source, None, dict(p.metadata)) for p in passages
        )

    def search(self, query_vectors: np.ndarray, k: int = 100) -> list[list[Passage]]:
        """Top-``k`` passages per query row, best first, ``score`` = cosine similarity.

        FAISS pads with id -1 when fewer than ``k`` results exist (small index, or IVF lists
        too few/empty for nprobe); those are dropped, so a list may be shorter than ``k``.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        queries = _normalised(query_vectors, self.dim)
        if self._index is None or not self._passages:
            return [[] for _ in range(len(queries))]
        k_eff = min(k, len(self._passages))
        if self._gpu.is_gpu(self._index):
            k_eff = min(k_eff, GPU_MAX_K)
        scores, ids = self._index.search(queries, k_eff)
        return [
            [self._passages[i].with_score(s) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores.tolist(), ids.tolist(), strict=True)
        ]

    def save(self, path: str | os.PathLike, *, extra: dict[str, Any] | None = None) -> None:
        """Atomically write the index folder (see ``store``); ``extra`` goes in the manifest."""
        import faiss

        if self._index is None:
            # An empty index still round-trips: store an empty Flat of the right dim.
            cpu_index = faiss.IndexFlatIP(self.dim)
        else:
            cpu_index = self._gpu.to_cpu(self._index)
        fields = {
            "embedder": self.embedder_name,
            "dim": self.dim,
            "factory": self.factory,
            "nprobe": self._nprobe,
            "extra": extra or {},
        }
        write_index_dir(path, cpu_index, self._passages, fields)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        embedder: Embedder | None = None,
        *,
        use_gpu: bool | None = None,
    ) -> VectorIndex:
        """Open a saved index. With ``embedder`` given, its name and dim must match the
        index's; without, the recorded embedder is re-created (lazily: no model load until
        a query must be embedded)."""
        stored = read_index_dir(path)
        manifest = stored.manifest
        if embedder is None:
            embedder = Embedder(manifest["embedder"])
        elif embedder.name != manifest["embedder"] or embedder.dim != manifest["dim"]:
            raise IndexLoadError(
                f"index {path} was built with embedder {manifest['embedder']!r} (dim "
                f"{manifest['dim']}), not {embedder.name!r}; load it with the same embedder "
                "or rebuild the index"
            )
        self = cls.__new__(cls)
        self.embedder = embedder
        self.embedder_name = manifest["embedder"]
        self.dim = int(manifest["dim"])
        self.factory = manifest["factory"]
        self._nprobe = manifest["nprobe"]
        self._gpu = GpuPlacement(use_gpu)
        # An empty saved index is re-created (and trained) by the first add, as when new.
        empty = stored.index.ntotal == 0
        self._index = None if empty else self._gpu.to_device(stored.index)
        self._passages = stored.passages
        self.manifest = manifest
        if self._index is not None:
            self._apply_nprobe()
        return self
