"""Which models the batched engine serves, decided when it is built.

The batched engine writes every layer's keys and values into one
(rows, kv_heads, columns, head_dim) buffer per layer and positions each row's tokens
itself, so it needs the plainest shape of a decoder: every layer full attention over a
standard KV cache, a rotary embedding whose angles depend on the position alone, an
attention implementation that takes a 4-D additive mask, one device. It has been
checked on the Llama family (SmolLM2 is a ``LlamaForCausalLM``); other families are
refused rather than risk an answer that is not ``generate``'s.
"""

from __future__ import annotations

import torch

from ..models.attention_windows import FULL, attention_windows
from ..models.support import check_preallocated, check_supported

FAMILIES = ("llama",)  # model_type values whose layers and cache it was checked on


def check_batchable(model: torch.nn.Module) -> None:
    """Raise ValueError naming the reason unless the batched engine can serve ``model``."""
    check_supported(model)  # attention over a KV cache that takes the tree mask (sdpa/eager)
    config = model.config
    family = f"{type(model).__name__} (model_type {getattr(config, 'model_type', '?')!r})"
    if getattr(config, "model_type", None) not in FAMILIES:
        raise ValueError(f"{family}: the batched engine serves only Llama-style models "
                         f"(model_type in {FAMILIES}); use SpeculativeGenerator directly")
    windows = attention_windows(config)
    if not (windows.uniform and windows.by_type[0][1] == FULL):
        raise ValueError(f"{family} has sliding-window or chunked attention layers; the "
                         "batched engine needs full attention in every layer")
    check_preallocated(model, "batched engine")
