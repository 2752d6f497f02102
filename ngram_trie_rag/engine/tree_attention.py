"""Tree attention inputs: one forward pass verifies every branch of a draft tree.

The query block is ``[last committed token] + draft nodes`` (Q = 1 + N tokens). Node i
sits at position ``past_len + depth_i`` (the committed token at depth 0) and may see
the whole committed prefix plus its own ancestors and itself, never a sibling branch.
Masks are float (0 visible, -inf hidden): eager attention misreads boolean masks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..drafting.draft_tree import DraftTree


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
    sliding_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor]]:
    """Position ids (1, Q) and the additive mask (1, 1, Q, past_len + Q).

    With ``sliding_window`` (Gemma-style hybrid models) the mask is a dict keyed by
    layer type, the sliding one also hiding keys more than ``window - 1`` positions back.
    """
    depths = np.concatenate(([0], tree.depths))
    positions = past_len + depths  # (Q,)
    q = positions.size
    visible = np.ones((q, past_len + q), dtype=bool)
    visible[:, past_len:] = ancestor_matrix(tree)
    neg = torch.finfo(dtype).min
    full = _additive(visible, neg, device, dtype)
    pos = torch.as_tensor(positions, device=device).unsqueeze(0)
    if sliding_window is None:
        return pos, full
    key_pos = np.concatenate((np.arange(past_len), positions))  # (past_len + Q,)
    near = positions[:, None] - key_pos[None, :] < sliding_window
    return pos, {"full_attention": full,
                 "sliding_attention": _additive(visible & near, neg, device, dtype)}


def _additive(visible: np.ndarray, neg: float, device: torch.device,
              dtype: torch.dtype) -> torch.Tensor:
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~visible), neg)
    return mask.to(device)[None, None]
