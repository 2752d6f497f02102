"""A verification engine over a preallocated cache whose step shapes are fixed.

:class:`StaticEngine` runs the same steps as :class:`~ngram_trie_rag.engine.eager.EagerEngine`
(prefill, then per step one forward over ``[last] + tree``, then compaction to the
accepted path) with two differences that let the step be compiled, and captured as a
CUDA graph on a GPU:

- the KV cache is a Transformers :class:`~transformers.StaticCache`: one buffer per layer
  of ``capacity`` positions, allocated once and never moved. Every forward attends over
  the whole buffer; the attention mask hides the positions past the committed sequence.
- a draft tree is padded up to a fixed node count
  (:mod:`~ngram_trie_rag.engine.trees.tree_buckets`), so a handful of shapes (the plain
  step, and one per bucket) cover every step.

With ``uniform=U`` every decode step, a plain one included, is padded to ``U`` nodes:
one shape for the whole answer. A row's logits then come from the same kernels whatever
the other rows hold, so in bf16 or fp16, where a differently shaped matmul rounds
differently, ``plain``, ``chain`` and ``trie`` almost always give the same tokens as each
other (38 of 40 bf16 answers on a CPU): not always, since a tree row sees its ancestors'
keys at their node columns and a plain row the same keys at consecutive ones, and
attention may sum them in another grouping. It costs a plain step the price of a
``U``-node tree, which a GPU barely notices and a CPU does.

With ``compiled=True`` the step's forward goes through
``torch.compile(fullgraph=True, dynamic=False)`` (``mode="reduce-overhead"`` on CUDA):
one graph per shape (tree bucket and cache size). Prefill always runs eagerly. By
default (``background=True``) compiling never holds an answer: a request whose cache
size has shapes not yet compiled runs its steps eagerly, and asks a background thread
(:mod:`~ngram_trie_rag.engine.compiling.background_compile`) to compile all of them on scratch
inputs; requests that start once they are ready run compiled. A request runs wholly
eager or wholly compiled, never a mix, so its answer does not depend on when a compile
finished (in fp32 both give ``generate``'s tokens; in bf16 they may part at a near-tie).
:meth:`StaticEngine.compile_for` compiles a cache size's shapes and waits for them, as a
benchmark does before it times. ``background=False`` compiles each shape on first use,
inside the request.

Capacity: ``prefill(ids, capacity=None)`` needs ``len(ids) + max_new_tokens + largest
bucket + 1`` positions (``max_new_tokens`` as given to the engine, 1,024 by default, cut
to the model's context window). The cache is kept and reused by the next request while it
is large enough; a larger request allocates a bigger one, rounded up to a multiple of
:data:`CAPACITY_STEP` so that few sizes occur (each size is a new shape to compile). A
request that outgrows its cache mid-way raises ValueError: build the engine with a larger
``max_new_tokens`` or ``capacity``. One request at a time uses the cache (the engine's
lock serialises generations); the previous request's prefix is not reused.

Sliding and chunked windows (Mistral, Qwen2's windowed layers, Phi-3, Gemma 2 and 3):
every layer keeps the whole sequence in a full-length buffer, so a row's column is its
position in every layer and compaction is the same for all; each layer type gets its own
mask over that buffer, its window applied by position on the device (a draft node's
window ends at its own position, as in :mod:`~ngram_trie_rag.engine.trees.tree_attention`).
A sliding layer thus holds more keys than ``generate``'s ring buffer, and attends to the
same ones.

Models served: a rotary embedding that does not change with the sequence length,
attention implementation ``sdpa`` (boolean mask) or ``eager`` (additive float mask), one
device. Anything else raises ValueError when the engine is built.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..drafting.draft_tree import DraftTree
from .acceptance import DeviceTree, accept_step
from .compiling import artifacts
from .compiling.background_compile import BackgroundCompiler, check_not_stopping
from .compiling.cudagraph_threads import cudagraph_trees_for_this_thread
from .compiling.own_code import own_code
from .costs.bucket_curve import bucket_curve
from .costs.curve_cache import CurveVerbs, ModelCurve
from .costs.latency import LatencyCurve, sync_device
from .cpu import gqa_attention, linear_layout, openmp_team
from .cpu.transposed_rows import TransposedRows, faster_transposed
from .kv_cache import cache_kwargs
from .models.attention_windows import FULL, attention_windows
from .models.rope_limits import UNLIMITED
from .models.support import check_preallocated, check_supported
from .protocol import KV, EngineInfo, StepInputs
from .quant import quantization_of
from .trees.staging import Staging
from .trees.tree_buckets import BUCKETS, bucket_for, pad_tree

DEFAULT_MAX_NEW_TOKENS = 1024
CAPACITY_STEP = 256  # cache sizes are rounded up to a multiple of this
MAX_CAPACITIES = 16  # cache sizes an engine keeps compiled graphs for
_BOOL_MASK_ATTENTION = (None, "sdpa", gqa_attention.NAME)  # SDPA reads a boolean mask
TIMED_RUNS = 5  # runs per compiled step shape when its cost is measured (the median kept)
log = logging.getLogger(__name__)


@dataclass
class StaticKV(KV):
    """A request's cache in the static engine, and whether its steps run compiled."""

    compiled: bool = False
    columns: torch.Tensor | None = None  # (capacity,) the key position of each column


class StaticEngine(CurveVerbs):
    """Verification forwards over a preallocated :class:`~transformers.StaticCache`,
    eager or compiled (``compiled``), trees padded to ``buckets``.

    ``capacity``: the cache size to use for every request (None: sized per request, see
    the module's notes). ``max_new_tokens``: what a request may generate when the
    capacity is sized per request. ``curve`` pins the latency curve as for
    :class:`~ngram_trie_rag.engine.eager.EagerEngine`; the curve is the modules' stored
    one, never refined from these steps (padded, over the whole cache: they cost what
    they cost here; each generator's draft budget still learns from the steps it
    runs). A compiled step runs the linear layers of the step sizes in
    ``transposed_rows`` (rows: 1 for the plain step, 1 + bucket for a tree) in
    the transposed layout (:mod:`~ngram_trie_rag.engine.cpu.transposed_rows`); None: the
    sizes where that measures faster here, timed once a compile is first asked for. On a CPU,
    grouped-query attention runs packed (:mod:`~ngram_trie_rag.engine.cpu.gqa_attention`):
    the step passes a keyword that only its own forwards carry. ``background``: compile
    shapes on a background thread while requests run eagerly (see the module's notes).
    """

    def __init__(self, model: torch.nn.Module, lock: threading.Lock | None = None, *,
                 capacity: int | None = None, compiled: bool = False,
                 buckets: tuple[int, ...] = BUCKETS, curve: LatencyCurve | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 uniform: int | None = None, background: bool = True,
                 transposed_rows: tuple[int, ...] | None = None) -> None:
        check_supported(model)  # attention that takes the tree mask: 'sdpa' or 'eager'
        check_preallocated(model, "static engine")
        check_compiled_quantized(model, compiled)
        windows = attention_windows(model.config)
        if compiled and linear_layout.installed(model):
            raise ValueError("this model object has the base engine's linear variants "
                             "installed; compile a freshly loaded model")
        if uniform is not None:
            if uniform < 1:
                raise ValueError(f"uniform must be a positive node count, got {uniform!r}")
            buckets = (uniform,)
        if not buckets or min(buckets) < 1:
            raise ValueError(f"buckets must be positive node counts, got {buckets!r}")
        if capacity is not None:
            _check_capacity(capacity, buckets)
        self.model = model
        self.lock = lock or threading.Lock()
        self.windows = windows
        # the model's own modules run every forward: their stored curve
        self.costs = ModelCurve(model, self.lock, step=None, packed_gqa=False,
                                windows=windows, pinned=curve, refines=False)
        self.buckets = tuple(sorted(set(buckets)))
        self.uniform = uniform
        self.capacity = capacity
        self.max_new_tokens = max_new_tokens
        if compiled and model.device.type == "cpu" and not cpp_compiler():
            print("ngram-trie-rag: no C++ compiler on this host, which torch.compile needs on "
                  "a CPU: the static engine runs its steps eagerly", file=sys.stderr)
            compiled = False
        self.compiled = compiled
        self.bool_mask = (getattr(model.config, "_attn_implementation", None)
                          in _BOOL_MASK_ATTENTION)
        # masked grouped-query attention over the cache as stored, not repeated per head
        self._attention_kwargs = {}
        if gqa_attention.applies(model):
            gqa_attention.install(model)
            self._attention_kwargs = {gqa_attention.PACKING_KEYWORD: "masked"}
        self._keyword = next(iter(cache_kwargs(model, None)))  # "cache" or "past_key_values"
        self._cache: Any = None  # the StaticCache, reused while large enough
        self._columns: torch.Tensor | None = None  # (capacity,) key positions of the cache
        self._staging = Staging(model.device)
        self._cudagraphs = compiled and model.device.type == "cuda"
        self._compiled_fn = None
        # the step sizes (rows) whose compiled linear layers run transposed; None:
        # measured when a compile is first asked for (see :mod:`.transposed_rows`)
        self.transposed_rows = None if transposed_rows is None else frozenset(transposed_rows)
        self._layout_lock = threading.Lock()
        self._compiler = None  # compiles a cache size's shapes off the request path
        # padded node count -> seconds of a compiled step, measured once its shapes are
        # compiled (or stored from an earlier process): what its draft budgets read
        self.compiled_costs: dict[int, float] | None = None
        if compiled:
            config = torch._dynamo.config
            # Dynamo keeps a code object's graphs in one list with a length limit, so each
            # engine compiles its own copy of the step's code: its graphs (every step shape
            # at up to MAX_CAPACITIES cache sizes) never crowd out another engine's.
            need = MAX_CAPACITIES * len(self.step_sizes())
            for name, limit in (("cache_size_limit", need), ("recompile_limit", need),
                                ("accumulated_recompile_limit", 16 * need)):
                if hasattr(config, name):
                    setattr(config, name, max(getattr(config, name), limit))
            self._compiled_fn = torch.compile(
                own_code(self._compiled_forward), fullgraph=True, dynamic=False,
                mode="reduce-overhead" if self._cudagraphs else None)
            if background:
                self._compiler = BackgroundCompiler(self._compile_shapes,
                                                    "static engine's step shapes",
                                                    busy=lambda: self.lock.locked())

    def describe(self) -> EngineInfo:
        """Its name from how it was built; the modules; the rows whose compiled linear
        layers run transposed (known once a compile was first asked for)."""
        name = "uniform" if self.uniform is not None else "static"
        if self.compiled:
            name = "uniform-compiled" if self.uniform is not None else "compiled"
        rows = sorted(self.transposed_rows or ()) if self.compiled else []
        return EngineInfo(name, self.compiled, "modules", dict.fromkeys(rows, "transposed"))

    @property
    def curve(self) -> LatencyCurve:
        """The compiled steps' own costs once known (flat across each bucket, see
        :mod:`~ngram_trie_rag.engine.costs.bucket_curve`); until then, and for an engine
        that does not compile, the modules' stored curve."""
        if self.compiled_costs:
            return bucket_curve(self.compiled_costs)
        return self.costs.curve

    def compiled_ready(self, capacity: int) -> bool:
        """Whether requests with a ``capacity``-position cache run compiled now."""
        if self._compiled_fn is None:
            return False
        return self._compiler is None or self._compiler.ready(capacity)

    def request_compile(self, capacity: int) -> None:
        """Ask for a ``capacity``-position cache's shapes, compiled in the background
        (compiling engines only; see :meth:`compile_for` to wait for them)."""
        if self._compiler is not None:
            self._compiler.request(capacity)

    def choose(self, prompt_len: int, new_tokens: int) -> StaticEngine:
        """Every request runs here."""
        return self

    def finished(self) -> None:
        """Nothing to learn from a finished request."""

    def reuse_prefixes(self, enabled: bool) -> None:
        """Never: each request prefills its whole prompt into the preallocated cache."""

    def depth_room(self, past_len: int) -> int:
        """Unlimited: a RoPE that follows the sequence length is refused when built."""
        return UNLIMITED

    accept = staticmethod(accept_step)  # the tree is on the device already

    # ---- the cache --------------------------------------------------------------------
    def needed_capacity(self, prompt_len: int, new_tokens: int | None = None) -> int:
        """Positions a request with a ``prompt_len``-token prompt may fill, adding at most
        ``new_tokens`` (None: the engine's ``max_new_tokens``)."""
        window = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)
        limit = self.max_new_tokens if new_tokens is None else new_tokens
        new = max(1, min(limit, window - prompt_len))
        return prompt_len + new + max(self.buckets) + 1

    def capacity_for(self, prompt_len: int, new_tokens: int | None = None) -> int:
        """The cache size :meth:`prefill` gives such a request, the size whose shapes it
        runs: the engine's ``capacity``, else the needed size rounded up, or the kept
        cache's when that is larger (it is reused)."""
        needed = self.capacity or _round_up(self.needed_capacity(prompt_len, new_tokens))
        kept = self._cache.layers[0].max_cache_len if self._cache is not None else 0
        return kept if kept >= needed else needed

    def reserve(self, capacity: int) -> int:
        """Keep a cache of at least ``capacity`` positions from now on: every request
        that fits runs at that one size, so a compiled engine compiles one size's shapes
        for all of them (as a server sizes its cache up front). Returns the kept size."""
        _check_capacity(capacity, self.buckets)
        with torch.inference_mode():
            return self._cache_for(capacity).layers[0].max_cache_len

    def _cache_for(self, capacity: int):
        """The kept cache when it holds ``capacity`` positions, else a new one."""
        cache = self._cache
        if cache is not None and cache.layers[0].max_cache_len >= capacity:
            for layer in cache.layers:
                if layer.is_initialized:
                    layer.cumulative_length.fill_(0)
            return cache
        self._cache = self._columns = None  # the old buffers go before the new ones come
        cache = self._new_cache(capacity)
        self._cache = cache
        self._columns = torch.arange(capacity, device=self.model.device)
        return cache

    def _new_cache(self, capacity: int):
        """A cache of ``capacity`` positions with a full-length buffer in every layer,
        windowed ones included (see the module's notes)."""
        from transformers import StaticCache
        from transformers.cache_utils import Cache, StaticLayer

        if self.windows.uniform and self.windows.by_type[0][1] == FULL:
            return StaticCache(config=self.model.config, max_cache_len=capacity)
        text = self.model.config.get_text_config(decoder=True)
        return Cache(layers=[StaticLayer(max_cache_len=capacity)
                             for _ in range(text.num_hidden_layers)])

    # ---- the steps --------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: list[int], new_tokens: int | None = None,
                capacity: int | None = None) -> tuple[KV, torch.Tensor]:
        """Cache the prompt (eagerly) in a cache of ``capacity`` positions (None: the
        engine's ``capacity``, else sized for the prompt and ``new_tokens``, the most the
        request may add, or the engine's ``max_new_tokens``; see the module's notes); the
        logits (V,) after its last token. Every step attends over the whole cache, so a
        cache sized to the request is a faster one."""
        if capacity is None:
            capacity = self.capacity_for(len(ids), new_tokens)
        if len(ids) + 2 + max(self.buckets) > capacity:
            raise ValueError(f"a prompt of {len(ids)} tokens needs a cache of more than "
                             f"{capacity} positions")
        cache = self._cache_for(capacity)
        capacity = cache.layers[0].max_cache_len  # a kept larger cache is reused
        out = self.model(input_ids=torch.tensor([ids], device=self.model.device),
                         **{self._keyword: cache}, use_cache=True, logits_to_keep=1)
        compiled = self._compiled_fn is not None
        if compiled:  # on this thread, before any trace (see _choose_layout)
            self._choose_layout()
        if self._compiler is not None:  # compiled only once all its shapes are
            compiled = self._compiler.ready(capacity)
            if not compiled:
                self._compiler.request(capacity)
            elif self._cudagraphs and not self._compiler.idle():
                # a request records its CUDA graphs on first use, and a capture must not
                # overlap another size's warm-up on the compile thread (the allocator's
                # pool and synchronisations are process-wide): eager until that is done
                compiled = False
        kv = StaticKV(cache, len(ids), list(ids), compiled=compiled, columns=self._columns)
        if self.compiled and not compiled:  # its steps run eagerly: say so in its stats
            kv.ran_on = "uniform" if self.uniform is not None else "static"
        return kv, out.logits[0, -1]

    # ---- compiling --------------------------------------------------------------------
    def step_sizes(self) -> tuple[int, ...]:
        """The padded node counts of every step shape (0: the plain step)."""
        return (self.uniform,) if self.uniform is not None else (0, *self.buckets)

    def warm_up(self, prompt_lengths: Sequence[int], new_tokens: int,
                timeout: float | None = None) -> float:
        """For a compiling engine: one cache sized for the longest of ``prompt_lengths``
        (every such request then runs at that size, so each shape compiles once) and its
        step shapes compiled now. Seconds spent (0.0 for an engine that does not
        compile); RuntimeError when the shapes could not be compiled in time."""
        if self._compiled_fn is None or not prompt_lengths:
            return 0.0
        start = time.perf_counter()
        capacity = self.reserve(max(self.capacity_for(n, new_tokens) for n in prompt_lengths))
        if not self.compile_for(capacity, timeout):
            raise RuntimeError("the compiled engine could not compile its step shapes; "
                               "see the notice above, or run with the eager engine")
        return time.perf_counter() - start

    def compile_for(self, capacity: int, timeout: float | None = None) -> bool:
        """Compile every step shape of a ``capacity``-position cache and wait for them
        (at most ``timeout`` seconds): True when requests of that size now run compiled.
        False for an engine that does not compile."""
        if self._compiled_fn is None:
            return False
        self._choose_layout()
        if self._compiler is None:
            self._compile_shapes(capacity)
            return True
        return self._compiler.wait(capacity, timeout)

    def _compile_shapes(self, capacity: int) -> None:
        """Call the compiled step once per shape of a ``capacity``-position cache, on
        scratch inputs made as a request's are (its own cache and staging buffer, so it
        runs beside a request without touching its state, and hits the same guards);
        then time each shape (unless an earlier process stored the times). What compiling
        produced is taken from, and given to, the store of compiled steps
        (:mod:`~ngram_trie_rag.engine.compiling.artifacts`). Progress goes to the log."""
        device = self.model.device
        staging = Staging(device)
        sizes = self.step_sizes()
        key = self.artifact_key(capacity)  # host details: read once per compile
        stored = artifacts.load(key)
        if stored is not None:  # the layout the stored graphs bake in, unless chosen here
            with self._layout_lock:
                if self.transposed_rows is None:
                    self.transposed_rows = stored.transposed_rows
        self._choose_layout()
        log.info("compiling %d step shapes for a %d-position cache (%s)", len(sizes), capacity,
                 "from the stored compile" if stored is not None else "first compile here")
        if self._cudagraphs:
            cudagraph_trees_for_this_thread()
        on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        started = time.perf_counter()
        with on_device, torch.inference_mode():  # a thread starts on CUDA device 0
            cache = self._new_cache(capacity)
            self.model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device),
                       **{self._keyword: cache}, use_cache=True, logits_to_keep=1)
            kv = StaticKV(cache, 1, [0], columns=torch.arange(capacity, device=device))
            for i, size in enumerate(sizes, 1):
                check_not_stopping()  # the interpreter is exiting: no new shape
                start = time.perf_counter()
                self._scratch_step(kv, size, staging)
                # the next shape compiles for minutes (on a CPU) with no forward here:
                # a team kept that long would slow every answer beside it
                # (:mod:`.cpu.openmp_team`)
                openmp_team.release()
                log.info("compiled step shape %d/%d (%d draft nodes) in %.1f s", i, len(sizes),
                         size, time.perf_counter() - start)
            check_not_stopping()
            costs = stored.costs if stored is not None and stored.costs else {
                size: self._time_step(kv, size, staging) for size in sizes}
            openmp_team.release()
        self.compiled_costs = costs
        log.info("compiled %d step shapes in %.1f s; step costs (ms): %s", len(sizes),
                 time.perf_counter() - started,
                 ", ".join(f"{q}: {s * 1e3:.1f}" for q, s in sorted(costs.items())))
        if stored is None or stored.transposed_rows != self.transposed_rows:
            artifacts.save(key, costs, sorted(self.transposed_rows))

    def artifact_key(self, capacity: int) -> str:
        """The key of this engine's compiled steps for a ``capacity``-position cache in
        the store of compiled steps."""
        return artifacts.artifact_key(self.model, capacity, self.step_sizes(),
                                      "cudagraphs" if self._cudagraphs else "inductor")

    def _scratch_step(self, kv: StaticKV, size: int, staging: Staging) -> float:
        """One compiled step of ``size`` padded nodes on scratch state (a chain of
        ``size`` nodes after one cached token, written at position 1 again each time);
        the seconds of its forward, as a request's step is timed (inputs prepared)."""
        tree = DraftTree(np.arange(2, 2 + size), np.arange(-1, size - 1),
                         np.arange(1, size + 1))  # a chain of `size` nodes
        inputs = self._prepare(kv, 0, tree, staging)
        start = time.perf_counter()
        self._compiled_fn(inputs.ids, inputs.positions, inputs.mask, kv.cache)
        sync_device(self.model.device)
        seconds = time.perf_counter() - start
        for layer in kv.cache.layers:  # the next shape writes at position 1 again
            layer.cumulative_length.fill_(1)
        return seconds

    def _time_step(self, kv: StaticKV, size: int, staging: Staging) -> float:
        """Median seconds of a compiled step of ``size`` padded nodes (compiled already)."""
        return statistics.median(self._scratch_step(kv, size, staging)
                                 for _ in range(TIMED_RUNS))

    def _choose_layout(self) -> None:
        """Measure :attr:`transposed_rows` if not given: before the first trace, as
        the graphs bake it in, and on the thread that asks for the compile (1-4 s on
        two cores, once per process and model shape): on the compile thread its own
        OpenMP team would slow the products the steps later run without it (see
        :mod:`.background_compile`)."""
        with self._layout_lock:
            if self.transposed_rows is None:
                self.transposed_rows = faster_transposed(
                    self.model, [1 + size for size in self.step_sizes()])

    @torch.inference_mode()
    def prepare(self, kv: StaticKV, last: int, tree: DraftTree) -> StepInputs:
        """See :meth:`_prepare`."""
        return self._prepare(kv, last, tree, self._staging)

    def _prepare(self, kv: StaticKV, last: int, tree: DraftTree, staging: Staging) -> StepInputs:
        """Inputs of the forward verifying ``tree`` padded to its bucket: ids (1, Q),
        positions ``kv.length + depth`` (1, Q) and the mask (1, 1, Q, capacity) over the
        whole cache (the committed prefix, then each row's ancestors in the tree).

        The host sends ids, positions and the (Q, Q) ancestor block in one non-blocking
        copy; the mask's prefix columns are computed on the device. The tree stays on the
        device for :meth:`accept` and :meth:`commit`, which upload nothing."""
        n = len(tree)
        size = self._bucket(n)
        if size:
            padded = pad_tree(tree, size)
            tokens = np.concatenate(([last], padded.tokens))
            tokens[tokens < 0] = 0  # padding: any id the embedding takes
            depths = np.concatenate(([0], padded.depths))
            block = padded.ancestors
        else:
            tokens, depths = np.array([last]), np.zeros(1, dtype=np.int64)
            block = np.ones((1, 1), dtype=bool)
        q = len(tokens)
        past = kv.length
        capacity = kv.cache.layers[0].max_cache_len
        if past + q > capacity:
            raise ValueError(f"the cache of {capacity} positions is full ({past} cached, "
                             f"a step of {q}); build the engine with a larger "
                             "max_new_tokens or capacity")
        ids, positions, block = staging.upload(tokens[None], depths[None] + past, block)
        block = block.bool()  # (Q, Q)
        visible = (kv.columns < past).expand(q, capacity).clone()  # (Q, capacity)
        visible[:, past:past + q] = block
        mask = self._masks(visible, kv.columns, positions[0], past)
        on_device = DeviceTree(ids[0, 1:1 + n], block[:1 + n, :1 + n],
                               positions[0, 1:1 + n] - past, tree.max_depth)
        return StepInputs(ids, positions, mask, "stock", False, n, [last, *tree.tokens.tolist()],
                          tree=on_device)

    def _masks(self, visible: torch.Tensor, columns: torch.Tensor, positions: torch.Tensor,
               past: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """The (1, 1, Q, capacity) mask(s) from ``visible`` (Q, capacity), the prefix and
        ancestors each row sees: one when every layer attends alike, else one per layer
        type with its window applied by position (query ``positions`` (Q,); the key in
        column c sits at position c, a tree node's at its own position)."""
        keys = None  # (capacity,) each column's key position, when a window needs it
        by_window: dict = {}
        for _, window in self.windows.by_type:
            if window in by_window:
                continue
            reach = visible
            if window != FULL:
                if keys is None:
                    keys = columns.clone()
                    keys[past:past + positions.numel()] = positions
                reach = visible & window.visible(positions, keys)  # the rule, on tensors
            by_window[window] = self._mask(reach)
        if len(by_window) == 1:
            return next(iter(by_window.values()))
        return {layer_type: by_window[window] for layer_type, window in self.windows.by_type}

    def _mask(self, visible: torch.Tensor) -> torch.Tensor:
        """(Q, capacity) bool -> the (1, 1, Q, capacity) mask the attention reads."""
        if self.bool_mask:
            return visible[None, None]
        q, capacity = visible.shape
        mask = torch.zeros((1, 1, q, capacity), dtype=self.model.dtype, device=self.model.device)
        return mask.masked_fill_(~visible, torch.finfo(self.model.dtype).min)

    def _bucket(self, n: int) -> int:
        """The padded node count of an ``n``-node tree: its bucket, or ``n`` itself when
        it exceeds the largest bucket (a shape of its own, run eagerly); with ``uniform``,
        that size for every step."""
        if self.uniform is not None:
            if n > self.uniform:
                raise ValueError(f"a draft tree of {n} nodes exceeds this engine's uniform "
                                 f"step of {self.uniform} nodes; pass num_draft <= "
                                 f"{self.uniform}")
            return self.uniform
        if n > max(self.buckets):
            return n
        return bucket_for(n, self.buckets)

    @torch.inference_mode()
    def run(self, kv: StaticKV, inputs: StepInputs) -> torch.Tensor:
        """Logits (1 + N, V) of the real rows; all Q rows' keys and values are written at
        ``kv.length ..`` in the cache (the padding's are never visible and get overwritten)."""
        q = inputs.ids.shape[1]
        oversized = q - 1 > max(self.buckets)
        if kv.compiled and not oversized:
            if self._cudagraphs:  # a request may run on any thread (a batch's pool, say)
                cudagraph_trees_for_this_thread()
            logits = self._compiled_fn(inputs.ids, inputs.positions, inputs.mask, kv.cache)
            if self._cudagraphs:  # the graph's output buffer is reused by the next replay
                logits = logits.clone()
        else:
            logits = self._forward(inputs.ids, inputs.positions, inputs.mask, kv.cache)
        return logits[: 1 + inputs.drafted]

    def _compiled_forward(self, ids: torch.Tensor, positions: torch.Tensor,
                          mask: torch.Tensor, cache) -> torch.Tensor:
        """:meth:`_forward`, its linear layers over the listed row counts transposed:
        the code Dynamo traces (the mode becomes part of the graph)."""
        if not self.transposed_rows:
            return self._forward(ids, positions, mask, cache)
        with TransposedRows(self.transposed_rows):
            return self._forward(ids, positions, mask, cache)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 cache) -> torch.Tensor:
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                         **{self._keyword: cache}, use_cache=True, **self._attention_kwargs)
        return out.logits[0]

    @torch.inference_mode()
    def commit(self, kv: KV, inputs: StepInputs, path: list[int]) -> None:
        """Move the rows of ``last`` and the accepted ``path`` (query rows, 1-based) to
        ``kv.length ..`` in every layer, then set every layer's length past them. After
        :meth:`accept` the rows come from its result on the device, so ``path`` must be
        the path it returned."""
        past, m = kv.length, len(path)
        layers = kv.cache.layers
        if path != list(range(1, m + 1)):  # else the rows are in place already
            if inputs.tree is not None and inputs.tree.packed is not None:
                rows = inputs.tree.path_rows(m) + past  # the path :meth:`accept` read
            else:
                rows = torch.tensor([0, *path], device=layers[0].keys.device) + past
            for layer in layers:
                # gather (a copy) first, then write: source and target rows may overlap
                layer.keys[:, :, past:past + m + 1] = layer.keys.index_select(2, rows)
                layer.values[:, :, past:past + m + 1] = layer.values.index_select(2, rows)
        length = past + 1 + m
        for layer in layers:
            layer.cumulative_length.fill_(length)
        kv.length = length
        kv.ids.append(inputs.tokens[0])
        kv.ids.extend(inputs.tokens[i] for i in path)


def check_compiled_quantized(model: torch.nn.Module, compiled: bool) -> None:
    """Refuse compiled steps over quantized weights in an fp32 model, whose answers are
    promised to be the quantized model's own ``generate``'s: measured (int4 default
    model, Spec-Bench RAG, ``uniform-compiled``), 3 of 8 answers left it (the compiled
    norms and rotary round apart from the modules', and the bf16 kernel inputs amplify
    that). A bf16 or fp16 model, whose answers are not promised identical in any engine,
    may compile them."""
    scheme = quantization_of(model)
    if compiled and scheme is not None and model.dtype == torch.float32:
        raise ValueError(f"compiled steps do not run quantized weights ({scheme}) in an "
                         "fp32 model: compiled, its answers leave the quantized model's "
                         "own generate; use engine='eager' (the default's choice) or "
                         "'static', or load the model in bfloat16, whose answers are not "
                         "promised identical to generate, to compile")


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor would build CPU kernels with ($CXX, else a usual name)."""
    import os
    import shutil

    names = [os.environ["CXX"]] if os.environ.get("CXX") else []
    return next((p for n in [*names, "g++", "c++", "clang++"] if (p := shutil.which(n))), None)


def _check_capacity(capacity: int, buckets: tuple[int, ...]) -> None:
    """A cache must hold the committed token and the largest step after it."""
    if capacity < 2 + max(buckets):
        raise ValueError(f"capacity {capacity} leaves no room for a step of "
                         f"{1 + max(buckets)} tokens")


def _round_up(n: int, step: int = CAPACITY_STEP) -> int:
    return -(-n // step) * step


_STATIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STATIC_GUARD = threading.Lock()


def static_engine_for(model: torch.nn.Module, compiled: bool = False,
                      uniform: int | None = None, background: bool = True,
                      capacity: int | None = None) -> StaticEngine:
    """The one static engine of ``model`` per (``compiled``, ``uniform``, ``background``,
    ``capacity``): generators sharing it share its lock, cache and compiled graphs."""
    key = (compiled, uniform, background, capacity)
    with _STATIC_GUARD:
        engines = _STATIC.setdefault(model, {})
        engine = engines.get(key)
        if engine is None:
            engine = engines[key] = StaticEngine(model, threading.Lock(), compiled=compiled,
                                                 uniform=uniform, background=background,
                                                 capacity=capacity)
        return engine
