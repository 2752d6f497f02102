"""The engine: the model's forwards (direct Llama step or modules), the buffered KV
cache and its compaction, tree attention inputs, and the measured latency curve that
picks each forward's variant. Torch; knows nothing of tries.

Names are imported on first use (PEP 562): the engine's light modules (``engine_names``)
load without torch, for the command line's parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

_EXPORTS = {
    "KV": ".engine",
    "Engine": ".engine",
    "StepInputs": ".engine",
    "engine_for": ".engine",
    "LatencyCurve": ".latency",
}

if TYPE_CHECKING:
    from .engine import KV, Engine, StepInputs, engine_for
    from .latency import LatencyCurve

__all__ = ["KV", "Engine", "LatencyCurve", "StepInputs", "engine_for"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
