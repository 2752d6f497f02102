"""``engine="auto"``: the eager engine until the compiled one is ready, then the compiled one.

The compiled static engine decodes faster than the eager one once its step shapes are
compiled (2.5x ``generate`` against 1.95x on two CPU cores; 11x against 0.54x for a plain
bf16 step on an H200, docs/gpu.md), but compiling costs minutes, and a process that
answers one question and exits could never collect. So this engine

- answers every request on the eager engine at first;
- once the process has finished one answer (it is one that answers more: a wrapper in an
  app, a resident ``ask`` worker, ``chat``), or at once where this machine compiled them
  before, asks for the compiled engine's shapes for one cache of :attr:`capacity`
  positions, compiled on a background thread at low priority
  (:mod:`~ngram_trie_rag.engine.compiling.background_compile`), taken from the store of
  compiled steps when this machine compiled them before
  (:mod:`~ngram_trie_rag.engine.compiling.artifacts`);
- from then on sends each request that fits that cache to the compiled engine, the
  others (longer prompts or answers) to the eager one.

A request runs wholly on the engine chosen when it starts (:meth:`choose`), so its answer
never depends on when a compile finished; in fp32 both give ``generate``'s tokens. Each
answer's stats name the engine that ran it. :meth:`warm_up` compiles now and waits (a
benchmark, ``calibrate``, a server at start-up).

On a CPU ``auto`` is the eager engine unless ``NGRAM_TRIE_RAG_AUTO_ENGINE=compiled``: on
two cores, the default model's Spec-Bench RAG answers decoded at 0.95x the eager engine's
speed once compiled at the default capacity (``scripts/default_engine.py``, 8 prompts,
same tokens), so compiling there costs minutes for nothing.

Where the compiled engine does not apply, ``auto`` is the eager engine throughout: with
``NGRAM_TRIE_RAG_AUTO_ENGINE=eager`` in the environment (a shared host, a test suite), a
model with quantized weights (:mod:`~ngram_trie_rag.engine.quant`, which the compiled
engines refuse), a model
the static engine cannot serve (see :class:`~ngram_trie_rag.engine.static_engine.StaticEngine`),
and on a CPU a model the eager engine runs through its modules rather than the direct
Llama step (there it switches the linear layers' layout per forward, which a compiled
graph cannot follow), or a host without a C++ compiler.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Sequence

import torch

from ..drafting.draft_tree import DraftTree
from .compiling import artifacts
from .costs.curve_cache import CurveVerbs
from .cpu import llama_step
from .eager import EagerEngine, engine_for
from .protocol import KV, Engine, EngineInfo, StepInputs
from .quant import quantization_of
from .static_engine import CAPACITY_STEP, StaticEngine, cpp_compiler

# "eager": ``auto`` never compiles in this process or those it starts (a shared host, a
# test suite); "compiled": it compiles on a CPU too; unset or empty: on CUDA only.
AUTO_ENV = "NGRAM_TRIE_RAG_AUTO_ENGINE"
DEFAULT_CAPACITY = 2048  # positions: a RAG prompt of a few chunks and its answer
# The tree sizes compiled: a draft is at most ``num_draft`` nodes, 32 by default, so the
# static engine's 64-node bucket would cost a compile (a seventh of the total) for
# nothing; a pinned larger draft runs its oversized steps eagerly.
BUCKETS = (1, 4, 8, 16, 32)


class AutoEngine(CurveVerbs):
    """Chooses per request between a model's eager engine and its compiled static engine
    (see the module's notes). ``capacity``: the compiled engine's cache size (None:
    :data:`DEFAULT_CAPACITY`, within the model's context window); ``buckets``: the
    compiled engine's tree sizes."""

    def __init__(self, model: torch.nn.Module, capacity: int | None = None, *,
                 buckets: tuple[int, ...] = BUCKETS) -> None:
        self.eager: EagerEngine = engine_for(model)
        self.costs = self.eager.costs  # the curve verbs are the eager engine's
        self.lock = self.eager.lock  # one lock for both: the same weights, one request at a time
        self.compiled: StaticEngine | None = None
        self.why_eager = why_eager(model)
        if self.why_eager is None:
            try:
                self.compiled = StaticEngine(model, self.lock, compiled=True, buckets=buckets,
                                             capacity=_capacity(model, capacity))
            except ValueError as exc:
                self.why_eager = str(exc)
        self.capacity = self.compiled.capacity if self.compiled is not None else None
        self._asked = False  # whether the compile was asked for
        compiled_before = self.compiled is not None and artifacts.exists(
            self.compiled.artifact_key(self.capacity))
        if compiled_before:  # a process here used it, and it loads faster than it compiles
            self._ask()

    # ---- choosing ---------------------------------------------------------------------
    def choose(self, prompt_len: int, new_tokens: int) -> Engine:
        """The engine a request of ``prompt_len`` tokens adding at most ``new_tokens``
        runs on, start to end: the compiled one when its shapes are ready and the
        request fits its cache, else the eager one."""
        engine = self.compiled
        if engine is None or not engine.compiled_ready(self.capacity):
            return self.eager
        if engine.needed_capacity(prompt_len, new_tokens) > self.capacity:
            return self.eager
        return engine

    def finished(self) -> None:
        """A request ended: the process answers more than once, so compiling pays, and
        so does measuring the eager engine's forward variants (on a CPU)."""
        self.eager.finished()
        if self.compiled is not None and not self._asked:
            self._ask()

    def _ask(self) -> None:
        self._asked = True
        self.compiled.request_compile(self.capacity)

    def warm_up(self, prompt_lengths: Sequence[int], new_tokens: int,
                timeout: float | None = None) -> float:
        """Compile the compiled engine's shapes now and wait for them; seconds spent (0.0
        where ``auto`` stays eager). RuntimeError when they could not be compiled."""
        if self.compiled is None:
            return 0.0
        self._asked = True
        start = time.perf_counter()
        if not self.compiled.compile_for(self.capacity, timeout):
            raise RuntimeError("the compiled engine could not compile its step shapes; "
                               "see the notice above, or run with engine='eager'")
        return time.perf_counter() - start

    def describe(self) -> EngineInfo:
        """``auto``: what it runs now (the compiled engine once ready, else eager)."""
        ready = self.compiled is not None and self.compiled.compiled_ready(self.capacity)
        now = (self.compiled if ready else self.eager).describe()
        return EngineInfo("auto", ready, now.forward, now.layouts)

    # ---- the protocol, for callers that do not choose per request ---------------------
    # A request chosen with :meth:`choose` calls its own engine; these serve the eager
    # engine, the one every request may fall back to (its curve verbs: CurveVerbs over
    # the eager engine's own ModelCurve).
    def reuse_prefixes(self, enabled: bool) -> None:
        self.eager.reuse_prefixes(enabled)

    def depth_room(self, past_len: int) -> int:
        return self.eager.depth_room(past_len)

    def prefill(self, ids: list[int], new_tokens: int | None = None) -> tuple[KV, torch.Tensor]:
        return self.eager.prefill(ids, new_tokens)

    def prepare(self, kv: KV, last: int, tree: DraftTree) -> StepInputs:
        return self.eager.prepare(kv, last, tree)

    def run(self, kv: KV, inputs: StepInputs) -> torch.Tensor:
        return self.eager.run(kv, inputs)

    def accept(self, inputs, tree, logits, params, rng):  # noqa: ANN001, ANN201 - as eager
        return self.eager.accept(inputs, tree, logits, params, rng)

    def commit(self, kv: KV, inputs: StepInputs, path: list[int]) -> None:
        self.eager.commit(kv, inputs, path)


def why_eager(model: torch.nn.Module) -> str | None:
    """Why ``auto`` (and the batched engine by default) cannot compile ``model``'s steps
    here, or None."""
    setting = os.environ.get(AUTO_ENV, "")
    if setting not in ("", "eager", "compiled"):
        raise ValueError(f"{AUTO_ENV}={setting!r}: set it to 'eager' (auto never compiles), "
                         "'compiled' (auto compiles on a CPU too) or leave it unset")
    if setting == "eager":
        return f"{AUTO_ENV}=eager"
    scheme = quantization_of(model)
    if scheme is not None:  # engine="compiled" runs a bf16 one; not measured on a GPU yet
        return (f"quantized weights ({scheme}) run eagerly: compiled, an fp32 model's "
                "answers left the quantized model's own generate")
    if model.device.type == "cpu":
        if setting != "compiled":
            return (f"on a CPU the compiled step did not pay (0.95x the eager engine's "
                    f"decode, default model, two cores); {AUTO_ENV}=compiled compiles there")
        if not cpp_compiler():
            return "no C++ compiler on this host (torch.compile needs one on a CPU)"
        if not llama_step.applies(model):
            return ("on a CPU the eager engine runs this model through its modules, "
                    "switching their layout per forward")
    return None


def _capacity(model: torch.nn.Module, capacity: int | None) -> int:
    """The compiled engine's cache size: as given, else the default within the model's
    context window, rounded up to the engine's capacity step."""
    if capacity is not None:
        return capacity
    window = int(getattr(model.config, "max_position_embeddings", 0) or DEFAULT_CAPACITY)
    size = min(DEFAULT_CAPACITY, window)
    return -(-size // CAPACITY_STEP) * CAPACITY_STEP


_AUTO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_AUTO_GUARD = threading.Lock()


def auto_engine_for(model: torch.nn.Module, capacity: int | None = None) -> AutoEngine:
    """The one ``auto`` engine of ``model`` per ``capacity``: generators sharing it
    share its compile."""
    with _AUTO_GUARD:
        engines = _AUTO.setdefault(model, {})
        engine = engines.get(capacity)
        if engine is None:
            engine = engines[capacity] = AutoEngine(model, capacity)
        return engine
