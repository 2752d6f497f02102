"""The engine: the model's forwards (direct Llama step or modules), the buffered KV
cache and its compaction, tree attention inputs, and the measured latency curve that
picks each forward's variant. Torch; knows nothing of tries."""

from .engine import KV, Engine, StepInputs, engine_for
from .latency import LatencyCurve

__all__ = ["KV", "Engine", "LatencyCurve", "StepInputs", "engine_for"]
