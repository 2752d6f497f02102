"""Which FAISS index to build for N vectors of dimension d.

Why these numbers (see DESIGN.md, Retrieval):
* Below 10,000 vectors an exact ``Flat`` inner-product scan takes well under a millisecond
  per query and loses nothing, so compression buys nothing.
* Above that, ``IVF{nlist},PQ{m}``. k-means wants ~39 points per centroid to train well
  (FAISS warns below that, and fails below 1 point per centroid), hence
  ``nlist = largest power of two <= N / 39``, capped at the paper's 4096. 8-bit PQ trains
  256 centroids per sub-quantizer, so it needs >= 256 training points (true above 10k).
  ``m`` must divide ``d``: the paper's 64 when it does (MiniLM 384/64 = 6 dims per
  sub-vector, bge-m3 1024/64 = 16), else the largest divisor of ``d`` below 64.
* From ~160k vectors (39 x 4096) this yields exactly the paper's ``IVF4096,PQ64``, nprobe 16.
"""

from __future__ import annotations

import re

FLAT = "Flat"
FLAT_MAX_VECTORS = 10_000
POINTS_PER_CENTROID = 39
MAX_NLIST = 4096
PAPER_FACTORY = "IVF4096,PQ64"
DEFAULT_NPROBE = 16
PQ_M = 64
PQ_MIN_TRAINING = 256  # 2**8 centroids per sub-quantizer for 8-bit codes


def pq_m_for_dim(dim: int, preferred: int = PQ_M) -> int:
    """Largest divisor of ``dim`` that is <= ``preferred`` (so sub-vectors tile the vector)."""
    if dim < 1:
        raise ValueError(f"dim must be positive, got {dim}")
    return max(m for m in range(1, min(preferred, dim) + 1) if dim % m == 0)


def nlist_for_count(n: int) -> int:
    """Largest power of two <= n / 39, at least 1, at most 4096."""
    target = max(1, n // POINTS_PER_CENTROID)
    return min(MAX_NLIST, 1 << (target.bit_length() - 1))


def choose_factory(n: int, dim: int) -> str:
    """The factory string the policy picks for ``n`` vectors of dimension ``dim``."""
    if n < FLAT_MAX_VECTORS:
        return FLAT
    return f"IVF{nlist_for_count(n)},PQ{pq_m_for_dim(dim)}"


_IVF = re.compile(r"(?:^|,)IVF(\d+)")


def factory_nlist(factory: str) -> int | None:
    """nlist of an ``IVF...`` factory string, or None for non-IVF factories."""
    match = _IVF.search(factory)
    return int(match.group(1)) if match else None


def default_nprobe(factory: str) -> int | None:
    """nprobe 16 (the paper's), or nlist when smaller; None for non-IVF indexes."""
    nlist = factory_nlist(factory)
    return None if nlist is None else min(DEFAULT_NPROBE, nlist)
