"""What a loaded model holds in memory: its parameters and buffers, each storage once."""

from __future__ import annotations

import torch


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (a tied weight counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "meta":
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total
