"""The engine: one model's forwards as the decode loop runs them, behind one protocol
(:class:`~ngram_trie_rag.engine.protocol.Engine`): prefill, prepare / run / accept /
commit a tree step, warm-up, the cost curve, and a description of itself. Two siblings
implement it: :class:`~ngram_trie_rag.engine.eager.EagerEngine` (a buffered cache, the
measured CPU variants) and :class:`~ngram_trie_rag.engine.static_engine.StaticEngine`
(a preallocated cache, fixed step shapes, compiled). Torch; knows nothing of tries.

Names are imported on first use (PEP 562): the engine's light modules (``engine_names``)
load without torch, for the command line's parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..util.lazy import lazy_exports
from .protocol import KV, Engine, EngineInfo, StepInputs  # no torch at import

_EXPORTS = {"EagerEngine": ".eager", "engine_for": ".eager", "LatencyCurve": ".costs.latency"}

if TYPE_CHECKING:
    from .costs.latency import LatencyCurve
    from .eager import EagerEngine, engine_for

__all__ = ["KV", "EagerEngine", "Engine", "EngineInfo", "LatencyCurve", "StepInputs",
           "engine_for"]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
