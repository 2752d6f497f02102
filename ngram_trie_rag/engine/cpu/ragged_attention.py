"""Attention for the queries of many sequences laid end to end, none padded.

A batched verification step of B sequences, each ``[last] + tree_b`` of its own size,
runs its products on the T = sum_b (1 + N_b) real queries only (one (1, T, hidden)
block: every product row is one query, whichever sequence it belongs to). Attention
alone needs to know the sequences: query t of row b sees row b's committed keys and
its own ancestors. :class:`RaggedAttention` places the T queries into a (B, Q) grid
(Q = the largest ``1 + N_b``; ``slots[t] = b * Q + j``), runs the row-wise attention
kernel over it (:mod:`~ngram_trie_rag.engine.quant.rowwise_attention`: each query over
the keys its ``allowed`` row names, and nothing else, so a grid place no query holds
costs one key) and gathers the T outputs back.

The kernel computes each query alone, from its own keys, so a query's output does not
depend on the other rows or on how many places the grid has: the same bits as the
same query in a padded step through the same kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quant import rowwise_attention


@dataclass(frozen=True)
class RaggedAttention:
    """The grid of one step: ``slots`` (T,) int64, each query's place ``b * Q + j``;
    ``allowed`` (B, Q, S) uint8, 1 where the place's query sees cache column s (an empty
    place sees column 0 only: finite, and dropped)."""

    slots: torch.Tensor
    allowed: torch.Tensor

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        """q (1, H, T, D) over k, v (B, H_kv, S, D) -> (1, T, H * D)."""
        _, heads, _, dim = q.shape
        b, q_len, _ = self.allowed.shape
        grid = q.new_zeros((b * q_len, heads, dim))
        grid[self.slots] = q[0].transpose(0, 1)
        grid = grid.view(b, q_len, heads, dim).transpose(1, 2)  # (B, H, Q, D)
        out = rowwise_attention.attend(grid, k, v, self.allowed, False, scale)  # (B, Q, H, D)
        return out.reshape(b * q_len, heads * dim)[self.slots][None]
