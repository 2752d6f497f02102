"""Fixed tree sizes for compiled verification steps.

A compiled graph is specialised to its input shapes, so a draft tree of any size N is
padded up to the smallest of a few node counts (``BUCKETS``): a handful of graphs cover
every step. A plain step (no draft nodes) is its own shape, bucket 0.

Why padding is safe: a padded node hangs directly under the committed token, so its mask
row sees only the prefix, the committed token and itself, and no real row sees it (it is
nobody's ancestor). The real rows' logits therefore do not depend on it, up to the last
bits of a differently shaped matmul. Its token is -1, which no argmax or draw can equal,
so no acceptance path ever goes through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...drafting.draft_tree import DraftTree
from .tree_attention import ancestor_matrix

BUCKETS: tuple[int, ...] = (1, 4, 8, 16, 32, 64)
PAD_TOKEN = -1  # never a vocabulary id


def bucket_for(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """Smallest bucket >= ``n`` node(s); 0 for a plain step."""
    if n < 0:
        raise ValueError(f"node count must be >= 0, got {n}")
    if n == 0:
        return 0
    for size in sorted(buckets):
        if size >= n:
            return size
    raise ValueError(
        f"draft tree of {n} nodes exceeds the largest bucket ({max(buckets)}); "
        f"draft at most {max(buckets)} nodes or add a larger bucket")


@dataclass(frozen=True, eq=False)
class PaddedTree:
    """A draft tree padded to ``size`` nodes; real nodes first, in pre-order."""

    tokens: np.ndarray  # (size,) int64, padding = -1
    parents: np.ndarray  # (size,) int64, -1 = child of the committed token (all padding)
    depths: np.ndarray  # (size,) int64, padding = 1
    ancestors: np.ndarray  # (1 + size, 1 + size) bool, [i, j]: j is i or an ancestor of i
    real: int  # number of real nodes
    max_depth: int  # of the real nodes, 0 when there are none

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def draft_tree(self) -> DraftTree:
        """The padded nodes as a plain tree (e.g. for positions and the attention mask)."""
        return DraftTree(self.tokens, self.parents, self.depths)


def pad_tree(tree: DraftTree, size: int) -> PaddedTree:
    """Pad ``tree`` with ``size - len(tree)`` dummy nodes under the committed token."""
    n = len(tree)
    if size < n:
        raise ValueError(f"cannot pad a tree of {n} nodes to {size}")
    pad = size - n
    tokens = np.concatenate((tree.tokens, np.full(pad, PAD_TOKEN))).astype(np.int64)
    parents = np.concatenate((tree.parents, np.full(pad, -1))).astype(np.int64)
    depths = np.concatenate((tree.depths, np.ones(pad))).astype(np.int64)
    ancestors = np.eye(1 + size, dtype=bool)
    ancestors[: 1 + n, : 1 + n] = ancestor_matrix(tree)
    ancestors[1 + n:, 0] = True  # padding sees the committed token and itself only
    return PaddedTree(tokens, parents, depths, ancestors, n, tree.max_depth)
