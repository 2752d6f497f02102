"""Quantized weights: int8 and int4 weights with activations in a float dtype, and
w8a8 (int8 weights, int8 activations rounded per token).

Names are imported on first use (PEP 562): ``SCHEMES`` and ``check_scheme`` load without
torch, for the command line's parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...util.lazy import lazy_exports
from .names import SCHEMES, check_scheme  # no torch at import

_EXPORTS = {"quantize_model": ".apply", "quantization_of": ".apply", "model_bytes": ".memory"}

if TYPE_CHECKING:
    from .apply import quantization_of, quantize_model
    from .memory import model_bytes

__all__ = ["SCHEMES", "check_scheme", "model_bytes", "quantization_of", "quantize_model"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
