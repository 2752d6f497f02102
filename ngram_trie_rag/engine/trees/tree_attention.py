"""Tree attention inputs: one forward pass verifies every branch of a draft tree.

The query block is ``[last committed token] + draft nodes`` (Q = 1 + N tokens). Node i
sits at position ``past_len + depth_i`` (the committed token at depth 0) and may see
the committed prefix plus its own ancestors and itself, never a sibling branch; in a
layer with a sliding window, only those within the window that ends at its own position.
Masks are float (0 visible, -inf hidden): eager attention misreads boolean masks.
"""

from __future__ import annotations

import numpy as np
import torch

from ...drafting.draft_tree import DraftTree
from ..models.attention_windows import FULL, AttentionWindows, Window


def ancestor_matrix(tree: DraftTree) -> np.ndarray:
    """(Q, Q) bool, ``[i, j]`` true iff query j is i itself or an ancestor of i (root = 0)."""
    q = len(tree) + 1
    parent = np.concatenate(([-1], tree.parents + 1))  # root's parent is -1; node -1 -> root
    visible = np.eye(q, dtype=bool)
    rows = np.arange(q)
    cur = parent.copy()
    for _ in range(tree.max_depth):  # walk every node up one level per iteration
        ok = cur >= 0
        visible[rows[ok], cur[ok]] = True
        cur = np.where(ok, parent[np.maximum(cur, 0)], -1)
    return visible


def tree_inputs(
    tree: DraftTree,
    past_len: int,
    device: torch.device,
    dtype: torch.dtype,
    windows: AttentionWindows | None = None,
) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor]]:
    """Position ids (1, Q) and the additive mask (1, 1, Q, past_len + Q).

    With ``windows`` (see :mod:`~ngram_trie_rag.engine.models.attention_windows`) each node
    also sees only the keys within its own window, measured from its own position:
    node i at ``p_i = past_len + depth_i`` sees key position ``k`` (committed or an
    ancestor) iff ``p_i - window < k``. One mask when every layer attends alike, else a
    dict keyed by layer type (e.g. ``{"full_attention": ..., "sliding_attention": ...}``).
    """
    windows = windows or AttentionWindows()
    depths = np.concatenate(([0], tree.depths))
    positions = past_len + depths  # (Q,)
    q = positions.size
    visible = np.ones((q, past_len + q), dtype=bool)
    visible[:, past_len:] = ancestor_matrix(tree)
    key_pos = np.concatenate((np.arange(past_len), positions))  # (past_len + Q,)
    neg = torch.finfo(dtype).min
    pos = torch.as_tensor(positions, device=device).unsqueeze(0)
    masks: dict[Window, torch.Tensor] = {}
    for _, window in windows.by_type:
        if window not in masks:
            reach = visible if window == FULL else visible & window.visible(positions, key_pos)
            masks[window] = _additive(reach, neg, device, dtype)
    if windows.uniform:
        return pos, next(iter(masks.values()))
    return pos, {layer_type: masks[window] for layer_type, window in windows.by_type}


def _additive(visible: np.ndarray, neg: float, device: torch.device,
              dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~visible), neg)
    return mask.to(device)[None, None]
