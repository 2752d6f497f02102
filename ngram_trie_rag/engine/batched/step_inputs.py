"""One batched verification forward's inputs: every row's ``[last] + tree``, padded to
one node count (:func:`batch_inputs`), or end to end unpadded (:func:`ragged_inputs`).

Row b's tree is padded (:func:`~..trees.tree_buckets.pad_tree`) to the common size N,
the smallest bucket holding the largest tree of the step, so the forward is
(n, Q = 1 + N). Row b's node i sits at position ``length_b + depth_i`` and sees row b's
committed columns ``0 .. length_b`` and its own ancestors (written at columns
``length_b + j``); padding nodes hang under ``last`` and no real node sees them, so their
outputs are ignored. The mask is additive float (0 visible, the dtype's minimum hidden):
Transformers' eager attention misreads boolean masks, and a fully hidden row stays finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...drafting.draft_tree import DraftTree
from ..cpu.ragged_attention import RaggedAttention
from ..trees.tree_attention import ancestor_matrix
from ..trees.tree_buckets import BUCKETS, bucket_for, pad_tree


@dataclass(frozen=True)
class BatchInputs:
    """Tensors of one step over rows ``0 .. n - 1``."""

    ids: torch.Tensor  # (n, Q) int64, padding 0
    positions: torch.Tensor  # (n, Q) int64, length_b + depth
    mask: torch.Tensor  # (n, 1, Q, width) additive float
    columns: torch.Tensor  # (n, Q) int64, the cache column of each query: length_b + j
    width: int  # key columns attended: max_b length_b + Q
    drafted: tuple[int, ...]  # real draft nodes per row (its logits: 1 + drafted rows)


def step_size(trees: Sequence[DraftTree], buckets: tuple[int, ...] = BUCKETS) -> int:
    """The common padded node count: 0 when no row drafted, else the bucket of the
    largest tree."""
    largest = max((len(t) for t in trees), default=0)
    return bucket_for(largest, buckets) if largest else 0


def batch_inputs(lengths: Sequence[int], lasts: Sequence[int], trees: Sequence[DraftTree],
                 size: int, device: torch.device, dtype: torch.dtype,
                 width: int | None = None) -> BatchInputs:
    """Inputs for rows with committed ``lengths``, newest tokens ``lasts`` and ``trees``,
    each padded to ``size`` nodes; the mask over ``width`` key columns (None: the fewest,
    ``max_b length_b + Q``; a compiled step passes every column of a row)."""
    n, q = len(lengths), 1 + size
    ids = np.zeros((n, q), dtype=np.int64)
    depths = np.zeros((n, q), dtype=np.int64)
    ancestors = np.zeros((n, q, q), dtype=bool)  # [b, i, j]: j is i or an ancestor of i
    for b, (last, tree) in enumerate(zip(lasts, trees, strict=True)):
        padded = pad_tree(tree, size)
        ids[b, 0] = last
        ids[b, 1:] = np.maximum(padded.tokens, 0)  # padding: any id the embedding takes
        depths[b, 1:] = padded.depths
        ancestors[b] = padded.ancestors
    past = np.asarray(lengths, dtype=np.int64)
    columns = past[:, None] + np.arange(q)  # (n, Q)
    width = int(past.max()) + q if width is None else width
    visible = np.arange(width)[None, None, :] < past[:, None, None]  # (n, 1, width) prefix
    visible = np.repeat(visible, q, axis=1)  # (n, Q, width)
    rows = np.arange(n)[:, None, None]
    visible[rows, np.arange(q)[None, :, None], columns[:, None, :]] = ancestors
    mask = torch.zeros((n, 1, q, width), dtype=dtype)
    mask.masked_fill_(torch.from_numpy(~visible)[:, None], torch.finfo(dtype).min)
    return BatchInputs(ids=torch.from_numpy(ids).to(device),
                       positions=torch.from_numpy(past[:, None] + depths).to(device),
                       mask=mask.to(device), columns=torch.from_numpy(columns).to(device),
                       width=width, drafted=tuple(len(t) for t in trees))


@dataclass(frozen=True)
class RaggedInputs:
    """Tensors of one unpadded step: row b's ``[last] + tree_b`` (``1 + N_b`` queries)
    end to end, T queries in all, rows in order."""

    ids: torch.Tensor  # (1, T) int64
    positions: torch.Tensor  # (1, T) int64, length_b + depth
    rows: torch.Tensor  # (T,) int64, each query's cache row b
    columns: torch.Tensor  # (T,) int64, its cache column: length_b + j
    attention: RaggedAttention  # its place in the (B, Q) grid and the keys each place sees
    offsets: tuple[int, ...]  # (B + 1,): row b's queries are offsets[b] .. offsets[b + 1]
    width: int  # key columns attended: max_b length_b + 1 + N_b


def ragged_inputs(rows: Sequence[tuple[int, int, DraftTree] | None], device: torch.device
                  ) -> RaggedInputs:
    """Inputs for cache rows ``0 .. B - 1``: each ``(length_b, last_b, tree_b)``, or None
    for a row with no queries this step (it holds its place in the grid, empty).

    The grid is (B, Q = max_b 1 + N_b); query j of row b sees columns ``0 .. length_b``
    and its ancestors (columns ``length_b + j'``); an empty place sees column 0 only."""
    given = [r for r in rows if r is not None]
    if not given:
        raise ValueError("a ragged step needs at least one row with queries")
    q = max(1 + len(tree) for _, _, tree in given)
    width = max(length + 1 + len(tree) for length, _, tree in given)
    visible = np.zeros((len(rows), q, width), dtype=bool)
    visible[:, :, 0] = True  # every place sees column 0 (an empty one only that)
    ids, positions, row_of, columns, slots, offsets = [], [], [], [], [], [0]
    for b, row in enumerate(rows):
        if row is not None:
            length, last, tree = row
            n = 1 + len(tree)
            ids += [last, *tree.tokens.tolist()]
            positions += [length, *(length + tree.depths).tolist()]
            row_of += [b] * n
            columns += range(length, length + n)
            slots += range(b * q, b * q + n)
            visible[b, :n, :length] = True
            visible[b, :n, length:length + n] = ancestor_matrix(tree)
        offsets.append(len(ids))
    allowed = torch.from_numpy(visible.astype(np.uint8)).to(device)
    return RaggedInputs(ids=_int64(ids, device)[None], positions=_int64(positions, device)[None],
                        rows=_int64(row_of, device), columns=_int64(columns, device),
                        attention=RaggedAttention(_int64(slots, device), allowed),
                        offsets=tuple(offsets), width=width)


def _int64(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)
