"""An input embedding over int8 rows: a lookup reads only the rows it needs.

Used by both schemes (an int4 table would need its own unpacking kernel for a lookup
that costs nothing next to the products). One symmetric scale per row; the row comes
back in the embedding's float dtype. When the model ties lm_head to this table, lm_head
is quantized separately by its scheme.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Int8Embedding(nn.Module):
    scheme = "int8"

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        w = embedding.weight.detach()
        self.num_embeddings, self.embedding_dim = w.shape
        self.padding_idx = embedding.padding_idx
        self.dtype = w.dtype
        scale = (w.float().abs().amax(dim=1) / 127).clamp(min=1e-12)  # (V,)
        self.register_buffer("qweight", (w.float() / scale[:, None]).round()
                             .clamp(-128, 127).to(torch.int8))  # (V, d)
        self.register_buffer("scale", scale.to(w.dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(input_ids, self.qweight)  # (..., d) int8
        return rows.to(self.dtype) * self.scale[input_ids][..., None]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, scheme=int8"
