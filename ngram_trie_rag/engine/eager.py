"""The eager engine: one model's forwards over a buffered cache, as the decode loop runs them.

Prefill, then per step one verification forward over ``[last] + tree`` (a plain step
when the tree is empty) and the KV cache compacted to the accepted path. Which code
runs a forward -- the direct Llama step or the modules, the linear layout, packed GQA
attention -- is decided here, from the model's structure and its measured latency
curve, and nowhere else; callers see the verbs of
:class:`~ngram_trie_rag.engine.protocol.Engine` only.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence

import torch

from ..drafting.draft_tree import DraftTree
from .acceptance import accept_step
from .costs import background_measure
from .costs.curve_cache import CurveVerbs, ModelCurve
from .costs.latency import LatencyCurve
from .cpu import gqa_attention, linear_layout, llama_step
from .cpu.forward import forward
from .cpu.thread_governor import ThreadGovernor, free_cores, intra_op_threads
from .kv_cache import cache_kwargs, compact, new_cache
from .models.attention_windows import AttentionWindows, attention_windows
from .models.rope_limits import UNLIMITED, rope_limit
from .models.support import check_supported
from .prefix_reuse import PrefixKeeper
from .protocol import KV, EngineInfo, StepInputs
from .quant import attention as quant_attention
from .trees.tree_attention import tree_inputs


class EagerEngine(CurveVerbs):
    """Forwards of one model over a buffered cache, shared by every generator over it.

    Building one sets the model up for the variants it may run (idempotent, see
    :func:`~ngram_trie_rag.engine.cpu.gqa_attention.install` and
    :func:`~ngram_trie_rag.engine.cpu.linear_layout.install`); nothing happens on import.
    ``lock``: the model's generation lock, held while the latency curve is probed.
    ``direct_step=False`` runs the modules even where the Llama step applies, and
    ``curve`` pins the latency curve (tests of each variant): it is then used as given,
    never looked up, probed or refined.
    A model whose cache cannot take a tree (recurrent, encoder-decoder) raises
    ValueError here (see :mod:`~ngram_trie_rag.engine.models.support`).
    """

    def __init__(self, model: torch.nn.Module, lock: threading.Lock | None = None, *,
                 direct_step: bool = True, curve: LatencyCurve | None = None) -> None:
        check_supported(model)
        background_measure.check_setting()  # a misspelt setting fails here, not later
        self.model = model
        self.lock = lock or threading.Lock()
        # each layer type's window, applied by position in tree masks
        self.windows: AttentionWindows = attention_windows(model.config)
        self._rope_limit = rope_limit(model)  # dynamic / longrope RoPE: depth limits
        self.packed_gqa = gqa_attention.applies(model)  # CPU + SDPA + GQA: no repeat_kv
        # a quantized model's attention reads fp64: its cache holds fp64 (exact widening)
        self.fp64_cache = quant_attention.reads_fp64(model)
        # Steps without module dispatch where the structure allows; None: the modules.
        direct = direct_step and llama_step.applies(model)
        self.step = llama_step.for_model(model) if direct else None
        if self.step is None:  # the modules run: switch their variants per forward
            if self.packed_gqa:
                gqa_attention.install(model)
            if linear_layout.applies(model):
                linear_layout.install(model)
        self.costs = ModelCurve(model, self.lock, step=self.step, packed_gqa=self.packed_gqa,
                                windows=self.windows, pinned=curve)
        # the latest sequence's cache, for a follow-up prompt; not where RoPE rebuilds it
        self.prefixes = PrefixKeeper(enabled=self._rope_limit is None)
        self._governor: ThreadGovernor | None = None  # CPU: threads per forward

    def describe(self) -> EngineInfo:
        """``eager``; the direct Llama step or the modules; the layouts the curve chose
        (a probed curve chooses none: only ``calibrate`` measures them)."""
        curve = self.costs.curve
        layouts = {q: curve.layout(q) for q in sorted(curve.seconds)
                   if curve.layout(q) != "stock"}
        return EngineInfo("eager", False, "modules" if self.step is None else "llama-step",
                          layouts)

    @property
    def sliding_window(self) -> int | None:
        """The smallest sliding window of the model's layers, or None."""
        return self.windows.sliding_window

    def depth_room(self, past_len: int) -> int:
        """The deepest draft a step at ``past_len`` cached tokens verifies exactly:
        unlimited except where the RoPE frequencies follow the sequence length
        (see :mod:`~ngram_trie_rag.engine.models.rope_limits`)."""
        return UNLIMITED if self._rope_limit is None else self._rope_limit.depth(past_len)

    def reuse_prefixes(self, enabled: bool) -> None:
        """Whether a prompt reuses the rows it shares with the previous sequence (never
        where RoPE rebuilds the cache)."""
        self.prefixes.enabled = enabled and self._rope_limit is None

    def choose(self, prompt_len: int, new_tokens: int) -> EagerEngine:
        """Every request runs here."""
        return self

    def finished(self) -> None:
        """A request ended: the process answers more than once, so measuring the forward
        variants pays (in another process, in the idle time between answers; see
        :mod:`~ngram_trie_rag.engine.costs.background_measure`)."""
        self.costs.measure_in_background()

    def warm_up(self, prompt_lengths: Sequence[int], new_tokens: int,
                timeout: float | None = None) -> float:
        """Nothing to compile: the cache grows as it goes. 0.0 seconds."""
        return 0.0

    def prefill(self, ids: list[int], new_tokens: int | None = None) -> tuple[KV, torch.Tensor]:
        """Cache the prompt: its KV and the logits (V,) after its last token. The rows
        it shares with the previous request's sequence are reused, not computed again
        (``kv.reused`` of them; see :mod:`~ngram_trie_rag.engine.prefix_reuse`).
        ``new_tokens``: the most the request may add (a preallocating engine sizes its
        cache by it; this one grows as it goes)."""
        kv, start = self.prefixes.take(ids)
        if kv is None:
            kv = KV(new_cache(self.fp64_cache), 0, [])
        with intra_op_threads(self._threads(probe=False)):
            logits = self._prefill(kv.cache, ids[start:])[0]
        kv.length, kv.ids[start:], kv.reused = len(ids), ids[start:], start
        kv.threads_used = {}  # this request's steps (a kept cache is the last request's)
        self.prefixes.keep(kv)  # grows with the answer; the next prompt may share it
        return kv, logits

    def _prefill(self, cache, ids: list[int]) -> torch.Tensor:
        """The model's own forward over ``ids`` into ``cache``: logits (1, V) after the
        last token."""
        out = self.model(input_ids=torch.tensor([ids], device=self.model.device),
                         **cache_kwargs(self.model, cache), use_cache=True, logits_to_keep=1)
        return out.logits[0, -1:]

    def prepare(self, kv: KV, last: int, tree: DraftTree) -> StepInputs:
        """Inputs of the forward verifying ``tree`` below ``last``: node i at position
        ``kv.length + depth_i``, seeing the prefix and its own ancestors only."""
        device = self.model.device
        tokens = [last, *tree.tokens.tolist()]
        ids = torch.tensor([tokens], device=device)
        if len(tree):
            pos, mask = tree_inputs(tree, kv.length, device, self.model.dtype,
                                    self.windows)
        else:
            pos, mask = torch.tensor([[kv.length]], device=device), None
        q = 1 + len(tree)
        recompute = (not len(tree) and self._rope_limit is not None
                     and self._rope_limit.recomputes(kv.length))
        return StepInputs(ids, pos, mask, self.curve.layout(q),
                          self.curve.packed(q, self.packed_gqa), len(tree), tokens, recompute)

    def run(self, kv: KV, inputs: StepInputs) -> torch.Tensor:
        """Logits (Q, V) of one prepared forward; its Q keys/values join the cache."""
        threads = self._threads()
        if threads is not None:
            kv.threads_used[threads] = kv.threads_used.get(threads, 0) + 1
        with intra_op_threads(threads):
            if inputs.recompute:  # the whole sequence again, into a fresh cache
                kv.cache = new_cache(self.fp64_cache)
                return self._prefill(kv.cache, [*kv.ids, *inputs.tokens])
            start = time.perf_counter()
            logits = forward(self.model, self.step, inputs.ids, inputs.positions,
                             inputs.mask, kv.cache, inputs.layout, inputs.packed)
            seconds = time.perf_counter() - start  # a CPU forward has finished on return
        if self._governor is not None and threads is not None:
            q = inputs.ids.shape[1]
            self._governor.observe(threads, seconds / self.curve.predict(q))
        return logits

    def _threads(self, probe: bool = True) -> int | None:
        """The intra-op threads of the next forward on a CPU (see
        :mod:`~ngram_trie_rag.engine.cpu.thread_governor`); ``None`` on other devices.
        ``probe=False``: the current count, never a probe (a prefill, which is not
        timed). The governor starts over when the process's own count changes."""
        if self.model.device.type != "cpu":
            return None
        given = torch.get_num_threads()
        if self._governor is None or self._governor.threads != given:
            self._governor = ThreadGovernor(given)
        governor = self._governor
        if not governor.mean and governor.active:  # nothing timed yet: look at the host
            free = free_cores(given)
            governor.current = max(n for n in governor.options if n <= free)
        return governor.threads_for_step() if probe else governor.current

    @property
    def governor(self) -> ThreadGovernor | None:
        """The CPU thread governor, once a forward has run (``None`` before, and on
        other devices)."""
        return self._governor

    accept = staticmethod(accept_step)  # the walk for the step (host or device)

    def commit(self, kv: KV, inputs: StepInputs, path: list[int]) -> None:
        """Keep the forward's rows of ``last`` and the accepted ``path`` (query rows,
        1-based), drop the rejected branches."""
        if inputs.drafted:
            compact(kv.cache, kv.length, [0, *path])
        kv.length += 1 + len(path)
        kv.ids.append(inputs.tokens[0])
        kv.ids.extend(inputs.tokens[i] for i in path)


_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENGINES_GUARD = threading.Lock()


def engine_for(model: torch.nn.Module) -> EagerEngine:
    """The one engine of ``model``: every generator over the same model object shares
    its lock (they share weights and compute) and its latency curve.

    The lock is a plain Lock, not an RLock: a stream may be advanced from different
    threads (e.g. ``asyncio.to_thread`` per chunk), and only a Lock can be released by
    another thread.
    """
    with _ENGINES_GUARD:
        engine = _ENGINES.get(model)
        if engine is None:
            engine = _ENGINES[model] = EagerEngine(model, threading.Lock())
        return engine

