"""The quantization schemes by name, and the check of the setting that picks one; no
torch at import, so the command line's parser and the wrappers' validators can use it."""

from __future__ import annotations

import difflib
from typing import Any

SCHEMES = ("int8", "int4", "w8a8")


def check_scheme(scheme: Any, device: Any = None) -> str | None:
    """``scheme`` (``None``, ``"int8"``, ``"int4"`` or ``"w8a8"``), refused by name when
    unknown or when ``device`` has no kernel for it, before anything loads."""
    if scheme is None:
        return None
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        close = difflib.get_close_matches(str(scheme), SCHEMES, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown quantization {scheme!r}{hint}; expected one of "
                         f"{', '.join(map(repr, SCHEMES))} or None (the model's own weights)")
    if device is None:
        return scheme
    import torch

    where = torch.device(device)
    if where.type not in ("cpu", "cuda"):
        raise ValueError(f"quantization={scheme!r} has kernels on CPU and CUDA only, not "
                         f"{where.type!r}: load in bf16 or fp16 there, or run on a CPU")
    if where.type == "cuda" and scheme == "w8a8":
        raise ValueError("quantization='w8a8' runs on CPUs (oneDNN's int8 x int8 products, "
                         "any row count); on a CUDA GPU use quantization='int8' or 'int4'")
    if where.type == "cuda" and scheme == "int4" and torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability(where)
        if major < 8:
            raise ValueError("quantization='int4' needs a CUDA GPU of compute capability "
                             "8.0 or newer (its bf16 kernel); use quantization='int8' here")
    return scheme
