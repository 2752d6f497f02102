"""One loaded model per (path, device, dtype), shared by every caller in the process.

Framework objects are copied freely (LangChain's ``bind`` and ``with_config``, LlamaIndex's
engines each building their own LLM), and loading weights costs seconds and hundreds of
MB, so weights are loaded on first use, once, under a lock. Generators that differ only in
trie shape (``n``, ``prefix_len``) share the weights, the tokenizer, the latency curve and
the model's lock: requests for one model queue on one lock whatever their trie shape.
"""

from __future__ import annotations

import threading
from pathlib import Path

from .generator import SpeculativeGenerator
from .loading import default_device, resolve_dtype

_LOCK = threading.Lock()
_BASE: dict[tuple[str | None, str, str], SpeculativeGenerator] = {}
_SHAPED: dict[tuple[str | None, str, str, int, int], SpeculativeGenerator] = {}


def _key(model: str | None, device: str | None, dtype: str | None):
    """(absolute path or None, torch device, torch dtype): equal settings, equal key."""
    import torch

    path = str(Path(model).expanduser().resolve()) if model else None
    where = torch.device(device) if device else default_device()
    return path, where, resolve_dtype(dtype, where)


def shared_generator(model: str | None = None, *, device: str | None = None,
                     dtype: str | None = None, n: int = 13,
                     prefix_len: int = 3) -> SpeculativeGenerator:
    """The process-wide generator for this model and trie shape, loading it on first use.

    Args:
        model: a local Hugging Face causal-LM folder; ``None`` is the packaged default.
        device: as in ``SpeculativeGenerator.from_pretrained`` (``None``: CUDA if any).
        dtype: likewise (``None``: fp32 on CPU, bf16 on CUDA).
        n: the trie's window (paper: 13).
        prefix_len: the longest matched prefix L_p (paper: 3).
    """
    path, where, precision = _key(model, device, dtype)
    key = (path, str(where), str(precision))
    with _LOCK:
        shaped = _SHAPED.get((*key, n, prefix_len))
        if shaped is not None:
            return shaped
        base = _BASE.get(key)
        if base is None:
            base = SpeculativeGenerator.from_pretrained(path, device=where, dtype=precision)
            _BASE[key] = base
        if (base.config.n, base.config.prefix_len) == (n, prefix_len):
            shaped = base
        else:
            shaped = base.reshaped(n=n, prefix_len=prefix_len)
        _SHAPED[(*key, n, prefix_len)] = shaped
        return shaped
