"""KV-cache compaction after a tree verification step.

A verification pass appends the keys/values of all Q = 1 + N tree tokens. Only the
committed token (query 0) and the accepted path survive: we move those rows to the
front of the new block and crop the rest, so the cache again holds exactly the
committed sequence. Cost: one gather of ``len(keep)`` rows per layer.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """A plain dynamic cache with full layers only.

    Hybrid models (sliding-window layers) still get full layers here: the sliding
    window is enforced by the attention mask instead, which keeps compaction uniform.
    """
    return DynamicCache()


def compact(cache: DynamicCache, block_start: int, keep: list[int]) -> None:
    """Keep block rows ``keep`` (ascending, relative to ``block_start``), drop the rest.

    Invariant: after the call every layer holds ``block_start + len(keep)`` positions.
    The committed prefix is never copied: rows move inside the new block only.
    """
    m = len(keep)
    contiguous = keep == list(range(m))
    index = None
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if not contiguous:
            if index is None:
                index = torch.tensor(keep, device=keys.device) + block_start
            # Gather first (a copy), then write: source and target rows may overlap.
            keys[:, :, block_start : block_start + m] = keys[:, :, index]
            values[:, :, block_start : block_start + m] = values[:, :, index]
        layer.keys = keys[:, :, : block_start + m]
        layer.values = values[:, :, : block_start + m]
