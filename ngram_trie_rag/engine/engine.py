"""The engine: one model's forwards as the decode loop runs them.

Prefill, then per step one verification forward over ``[last] + tree`` (a plain step
when the tree is empty) and the KV cache compacted to the accepted path. Which code
runs a forward -- the direct Llama step or the modules, the linear layout, packed GQA
attention -- is decided here, from the model's structure and its measured latency
curve, and nowhere else; the decode loop sees only :meth:`prefill`, :meth:`prepare`,
:meth:`run` and :meth:`commit`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import sampling
from ..drafting.draft_tree import DraftTree
from ..sampling import SamplingParams
from . import device_accept, gqa_attention, linear_layout, llama_step
from .attention_windows import AttentionWindows, attention_windows
from .curve_cache import calibrate, curve_for, refine
from .device_accept import DeviceTree
from .forward import forward
from .kv_cache import cache_kwargs, compact, new_cache
from .latency import LatencyCurve
from .linear_layout import Layout
from .prefix_reuse import PrefixKeeper
from .rope_limits import UNLIMITED, rope_limit
from .support import check_supported
from .thread_governor import ThreadGovernor, free_cores, intra_op_threads
from .tree_attention import tree_inputs


@dataclass
class KV:
    """One request's KV cache. Invariant: ``cache`` holds exactly ``length`` positions,
    the committed sequence except its newest token (fed by the next forward); ``ids``
    are their tokens (to recompute the cache where ``generate`` does)."""

    cache: Any
    length: int
    ids: list[int] = field(default_factory=list)
    reused: int = 0  # prompt rows taken from the previous request's cache


@dataclass(frozen=True)
class StepInputs:
    """One verification forward's inputs: ids (1, Q), positions (1, Q), mask (None for
    a plain step), and the variant it runs in."""

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | dict[str, torch.Tensor] | None
    layout: Layout
    packed: bool
    drafted: int  # N, draft nodes in the forward (Q = 1 + N)
    tokens: list[int] = field(default_factory=list)  # [last, *draft tokens]
    recompute: bool = False  # a plain step over the whole sequence, cache rebuilt
    tree: DeviceTree | None = None  # the tree on the device, where the engine keeps it


class Engine:
    """Forwards of one model, shared by every generator over it.

    Building one sets the model up for the variants it may run (idempotent, see
    :func:`~ngram_trie_rag.engine.gqa_attention.install` and
    :func:`~ngram_trie_rag.engine.linear_layout.install`); nothing happens on import.
    ``lock``: the model's generation lock, held while the latency curve is probed.
    ``direct_step=False`` runs the modules even where the Llama step applies, and
    ``curve`` pins the latency curve (tests of each variant): it is then used as given,
    never looked up, probed or refined.
    A model whose cache cannot take a tree (recurrent, encoder-decoder) raises
    ValueError here (see :mod:`~ngram_trie_rag.engine.support`).
    """

    def __init__(self, model: torch.nn.Module, lock: threading.Lock | None = None, *,
                 direct_step: bool = True, curve: LatencyCurve | None = None) -> None:
        check_supported(model)
        self.model = model
        self.lock = lock or threading.Lock()
        # each layer type's window, applied by position in tree masks
        self.windows: AttentionWindows = attention_windows(model.config)
        self._rope_limit = rope_limit(model)  # dynamic / longrope RoPE: depth limits
        self.packed_gqa = gqa_attention.applies(model)  # CPU + SDPA + GQA: no repeat_kv
        # Steps without module dispatch where the structure allows; None: the modules.
        direct = direct_step and llama_step.applies(model)
        self.step = llama_step.for_model(model) if direct else None
        if self.step is None:  # the modules run: switch their variants per forward
            if self.packed_gqa:
                gqa_attention.install(model)
            if linear_layout.applies(model):
                linear_layout.install(model)
        self._curve = curve
        self._pinned = curve is not None  # used as given: never refined
        # the latest sequence's cache, for a follow-up prompt; not where RoPE rebuilds it
        self.prefixes = PrefixKeeper(enabled=self._rope_limit is None)
        self._governor: ThreadGovernor | None = None  # CPU: threads per forward
        self.last_threads: int | None = None  # what the latest forward ran on

    @property
    def sliding_window(self) -> int | None:
        """The smallest sliding window of the model's layers, or None."""
        return self.windows.sliding_window

    def depth_room(self, past_len: int) -> int:
        """The deepest draft a step at ``past_len`` cached tokens verifies exactly:
        unlimited except where the RoPE frequencies follow the sequence length
        (see :mod:`~ngram_trie_rag.engine.rope_limits`)."""
        return UNLIMITED if self._rope_limit is None else self._rope_limit.depth(past_len)

    @property
    def curve(self) -> LatencyCurve:
        """The model's latency curve: this process's, else the stored one, else a quick
        probe (see :mod:`ngram_trie_rag.engine.curve_cache`); never a full measurement."""
        if self._curve is None:
            self._curve = curve_for(self.model, step=self.step, packed_gqa=self.packed_gqa,
                                    windows=self.windows, lock=self.lock)
        return self._curve

    def calibrate(self) -> Path | None:
        """Measure the full curve now (every size, every layout variant: the fastest
        variants are only chosen from a measured curve), store it and use it from here
        on; a pinned curve stays as given. Returns the curve's file (None: not stored)."""
        curve, path = calibrate(self.model, step=self.step, packed_gqa=self.packed_gqa,
                                windows=self.windows, lock=self.lock)
        if not self._pinned:
            self._curve = curve
        return path

    def refine_curve(self, seconds: Mapping[int, float]) -> None:
        """Take real steps' timings (forward size -> seconds, e.g. a draft budget's
        :meth:`~ngram_trie_rag.drafting.budget.DraftBudget.refined`) into the curve, for
        the budgets of later generations and, stored, of later processes. Layouts and
        packing stay as they are; a pinned curve stays as given."""
        if self._pinned or self._curve is None or not seconds:
            return
        refined = refine(self.model, self.step, seconds)
        if refined is not None:
            self._curve = refined

    def prefill(self, ids: list[int], new_tokens: int | None = None) -> tuple[KV, torch.Tensor]:
        """Cache the prompt: its KV and the logits (V,) after its last token. The rows
        it shares with the previous request's sequence are reused, not computed again
        (``kv.reused`` of them; see :mod:`~ngram_trie_rag.engine.prefix_reuse`).
        ``new_tokens``: the most the request may add (a preallocating engine sizes its
        cache by it; this one grows as it goes)."""
        kv, start = self.prefixes.take(ids)
        if kv is None:
            kv = KV(new_cache(), 0, [])
        with intra_op_threads(self._threads(probe=False)):
            logits = self._prefill(kv.cache, ids[start:])[0]
        kv.length, kv.ids[start:], kv.reused = len(ids), ids[start:], start
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
        self.last_threads = threads
        with intra_op_threads(threads):
            if inputs.recompute:  # the whole sequence again, into a fresh cache
                kv.cache = new_cache()
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
        :mod:`~ngram_trie_rag.engine.thread_governor`); ``None`` on other devices.
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

    def accept(self, inputs: StepInputs, tree: DraftTree, logits: torch.Tensor,
               params: SamplingParams, generator: torch.Generator | None
               ) -> tuple[list[int], list[int]]:
        """``(tokens, path)``: the accepted nodes' tokens plus the bonus token, and their
        query rows. On a CPU the host walk; elsewhere the walk as tensor ops with one
        transfer (the same greedy answer; seeded sampling draws differ, see
        :mod:`~ngram_trie_rag.engine.device_accept`). Reading the result waits for the
        forward: the step's host sync."""
        if inputs.tree is not None:
            return inputs.tree.accept(logits, params, generator)
        walk = sampling.accept if logits.device.type == "cpu" else device_accept.accept
        return walk(tree, logits, params, generator)

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


def engine_for(model: torch.nn.Module) -> Engine:
    """The one engine of ``model``: every generator over the same model object shares
    its lock (they share weights and compute) and its latency curve.

    The lock is a plain Lock, not an RLock: a stream may be advanced from different
    threads (e.g. ``asyncio.to_thread`` per chunk), and only a Lock can be released by
    another thread.
    """
    with _ENGINES_GUARD:
        engine = _ENGINES.get(model)
        if engine is None:
            engine = _ENGINES[model] = Engine(model, threading.Lock())
        return engine

