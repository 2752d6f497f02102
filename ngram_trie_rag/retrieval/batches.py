"""Embedding a corpus batch by batch, with a time estimate before the long part.

Why batches: embedding every passage in one call holds every text's token tensors and
every vector at once (about 1.5 GB for 41k passages); in batches of ``BATCH_SIZE`` the
index takes each batch's vectors as they come, so memory holds one batch (plus, for an
index that must be trained, the training sample: see ``training_sample``).

Why a probe: the rate depends on the machine, the embedder and the passage lengths, so
it is measured, on the first ``PROBE_SIZE`` passages, and the estimate reported before
the remaining ones are embedded. Those vectors are kept, so the probe costs nothing.

    >>> batch_bounds(2100, probe=64, size=1024)
    [(0, 64), (64, 1088), (1088, 2100)]
"""

from __future__ import annotations

from collections.abc import Callable

from .policy import PQ_MIN_TRAINING, factory_nlist

PROBE_SIZE = 64
BATCH_SIZE = 1024
# k-means wants >= 39 points per IVF list (FAISS warns below) and samples at most 256.
TRAINING_POINTS_PER_LIST = 64
Report = Callable[[str], None]


def batch_bounds(total: int, probe: int = PROBE_SIZE, size: int = BATCH_SIZE
                 ) -> list[tuple[int, int]]:
    """``[start, end)`` of each batch: a small timed probe first, then ``size`` each."""
    bounds, start = [], 0
    step = min(probe, total)
    while start < total:
        end = min(total, start + step)
        bounds.append((start, end))
        start, step = end, size
    return bounds


def training_sample(factory: str, total: int) -> int:
    """Vectors to hold before the first add of an index that needs training: enough for
    IVF's k-means (``TRAINING_POINTS_PER_LIST`` per list) and PQ's 256 centroids."""
    nlist = factory_nlist(factory) or 1
    return min(total, max(TRAINING_POINTS_PER_LIST * nlist, PQ_MIN_TRAINING * 16))


def duration(seconds: float) -> str:
    """``95`` -> ``"1 min 35 s"``; ``5400`` -> ``"1 h 30 min"``."""
    s = int(round(seconds))
    if s < 1:
        return "under 1 s"
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def estimate_line(total: int, done: int, seconds: float, embedder: str) -> str:
    """What the user reads before the long part: how many passages, how long, why."""
    rate = done / max(seconds, 1e-9)
    left = (total - done) / rate
    return (f"embedding {total:,} passages with {embedder}: about {duration(left)} more at "
            f"{rate:.0f} passages/s (timed on the first {done})")
