"""The batched engine's KV cache: one preallocated buffer per layer, one row per slot.

Layout, per layer: ``keys``/``values`` of shape (max_batch, kv_heads, columns, head_dim),
``columns = capacity + scratch``. Row ``r`` holds one sequence: its committed keys in
columns ``0 .. length_r`` (every token but the newest, as :class:`~..protocol.KV` says).
A step writes each row's ``[last] + tree`` at columns ``length_r ..`` of its own row, so
the columns past ``capacity`` (``scratch`` = the largest step) are room for a step that
starts at a full row. Columns past a row's length are never visible to it.

Rows ``0 .. active - 1`` are in use: a step over the first ``k`` rows computes ``k``
rows, whatever ``max_batch`` is. A leaving row takes the last active row's contents
(:meth:`SlotCache.move`), so the active rows stay at the front.
"""

from __future__ import annotations

import torch


class SlotCache:
    """Per-layer K/V buffers of ``max_batch`` rows by ``capacity + scratch`` columns."""

    def __init__(self, layers: int, max_batch: int, kv_heads: int, columns: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (max_batch, kv_heads, columns, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.columns = columns

    def load(self, row: int, layer_keys: list[torch.Tensor],
             layer_values: list[torch.Tensor]) -> None:
        """Copy a prefilled prompt into ``row``: per layer keys/values (1, H, L, D)."""
        for buf, src in zip(self.keys, layer_keys, strict=True):
            buf[row, :, : src.shape[-2]] = src[0]
        for buf, src in zip(self.values, layer_values, strict=True):
            buf[row, :, : src.shape[-2]] = src[0]

    def move(self, source: int, target: int, length: int) -> None:
        """Row ``target`` takes row ``source``'s first ``length`` columns."""
        for buf in (*self.keys, *self.values):
            buf[target, :, :length] = buf[source, :, :length]

    def compact(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """For every triple i: column ``dst[i]`` of row ``rows[i]`` takes its column
        ``src[i]`` (all (M,) int64). Gathered first, then written: a row's source and
        target columns may overlap."""
        for buf in (*self.keys, *self.values):
            by_col = buf.transpose(1, 2)  # (B, C, H, D) view: [row, col] picks (H, D)
            by_col[rows, dst] = by_col[rows, src]


class StepCache:
    """What a step's forward passes the model as its cache: each attention layer's
    :meth:`update` writes the step's keys/values into the rows' scratch columns and
    returns the first ``width`` columns of the first ``n`` rows to attend over (the
    mask hides what a row may not see).

    ``keys``/``values``: per layer the (max_batch, H, columns, D) buffers (a
    :class:`SlotCache`'s); ``columns`` (n, Q) int64: where row b's query j goes
    (``length_b + j``). An unpadded step's T queries end to end come as one sequence:
    ``columns`` (1, T) and ``rows`` (1, T), each query's cache row, of ``n`` rows.
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                 columns: torch.Tensor, width: int, rows: torch.Tensor | None = None,
                 n: int | None = None) -> None:
        self.keys, self.values = keys, values
        self.n = int(columns.shape[0]) if n is None else n
        # (n, 1): row b's queries in cache row b; or each query's own row
        self.rows = torch.arange(self.n, device=columns.device)[:, None] if rows is None else rows
        self.cols = columns  # (n, Q), or (1, T)
        self.width = width

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value_states (n, H, Q, D), or (1, H, T, D) -> the layer's keys/values
        (n, H, width, D)."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        # advanced indices around a slice: the indexed result is (n, Q, H, D)
        keys[self.rows, :, self.cols] = key_states.transpose(1, 2)
        values[self.rows, :, self.cols] = value_states.transpose(1, 2)
        return keys[: self.n, :, : self.width], values[: self.n, :, : self.width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Only read where no position ids are passed (never here)."""
        return 0

