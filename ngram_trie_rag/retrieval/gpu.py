"""Optional FAISS-on-GPU: used automatically when ``faiss-gpu`` sees a GPU, else a no-op.

Indexes are always kept convertible to CPU, because the saved format is the CPU
serialisation (an index saved on a GPU box loads on a laptop).
"""

from __future__ import annotations

import warnings
from typing import Any


def gpu_available() -> bool:
    import faiss

    try:
        return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except (AttributeError, RuntimeError):
        return False


class GpuPlacement:
    """Moves indexes to GPU 0 when available; keeps the resources object alive."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = gpu_available() if enabled is None else enabled and gpu_available()
        self._resources: Any = None

    def to_device(self, index: Any) -> Any:
        if not self.enabled:
            return index
        import faiss

        try:
            if self._resources is None:
                self._resources = faiss.StandardGpuResources()
            return faiss.index_cpu_to_gpu(self._resources, 0, index)
        except (RuntimeError, AttributeError) as exc:
            # Not every index type has a GPU version (e.g. HNSW): stay on CPU, say so.
            warnings.warn(f"FAISS GPU unavailable for this index, using CPU: {exc}", stacklevel=2)
            return index

    @staticmethod
    def to_cpu(index: Any) -> Any:
        import faiss

        if hasattr(faiss, "index_gpu_to_cpu") and type(index).__name__.startswith("Gpu"):
            return faiss.index_gpu_to_cpu(index)
        return index

    @staticmethod
    def is_gpu(index: Any) -> bool:
        return type(index).__name__.startswith("Gpu")
