"""A verification engine for many sequences at once: one forward per step for all.

:class:`BatchedEngine` keeps up to ``max_batch`` sequences in one preallocated cache
(:class:`~.slot_cache.SlotCache`, one row each). A request's life:

- :meth:`prefill` runs its prompt alone (batch 1, the model's own forward over a
  ``DynamicCache``, so its logits are exactly ``generate``'s), copies the keys/values
  into the first free row and returns a :class:`SlotKV` naming that row
  (:meth:`begin_prefill`: the same a chunk at a time, between other rows' steps);
- :meth:`run_batch` verifies every given row's ``[last] + tree`` in ONE forward over rows
  ``0 .. k - 1`` and returns each row's logits (1 + N_b, V). Where the direct Llama step
  attends with the row-wise kernel (fp32 on a CPU) the rows go unpadded: the products see
  each row's own ``1 + N_b`` queries end to end
  (:mod:`~ngram_trie_rag.engine.cpu.ragged_attention`; on two cores 12 rows of 0-16
  nodes took 234 ms a step against 522 ms padded to 16, median of 8);
  compiled, and elsewhere, trees are padded to one bucket (per-row positions and mask,
  see :mod:`~.step_inputs`);
- :meth:`accept` walks one row's tree (the single engines' acceptance, so greedy and
  seeded sampling choose as they do), and :meth:`commit` (or :meth:`commit_all` for a
  whole step: one gather per layer) moves its accepted path into its committed columns;
- :meth:`release` frees its row; the last active row moves into it, so the active rows
  stay ``0 .. active - 1`` and a step with n active rows computes n rows, not
  ``max_batch``. A row left out of a step (paused, say) but below the last stepped row
  has no queries in an unpadded step; in a padded one it is computed as a dummy (its
  outputs dropped, its writes past its committed length).

Eager steps run the direct Llama step on a CPU
(:mod:`~ngram_trie_rag.engine.cpu.llama_step`, its GQA packed) where it applies, else the
modules. With ``compiled`` (by default where ``engine="auto"`` compiles: on CUDA, and on
a CPU with ``NGRAM_TRIE_RAG_AUTO_ENGINE=compiled``) the steps run compiled once every
shape is (:mod:`~.compiled_step`: rows padded to a batch bucket, trees to
:data:`~.compiled_step.TREE_SIZES`, CUDA graphs on a GPU), eagerly until then and for a
tree larger than the largest size. Llama-style models
only (:mod:`~.support`). Not thread-safe: one thread (a scheduler's) calls it, holding
:attr:`lock` (the model's lock, shared with the generator's engine) around each forward.
It implements enough of :class:`~ngram_trie_rag.engine.protocol.Engine` for
:class:`~ngram_trie_rag.generator.SpeculativeGenerator`'s request set-up and per-row
phases; its latency curve is the generator's engine's (single-sequence forwards).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ...drafting.draft_tree import DraftTree
from ..acceptance import accept_step
from ..cpu import llama_step
from ..kv_cache import cache_kwargs
from ..models.rope_limits import UNLIMITED
from ..protocol import KV, Engine, EngineInfo, StepInputs
from ..quant import rowwise_attention
from ..trees.tree_buckets import BUCKETS
from .compiled_step import TREE_SIZES, CompiledBatchedStep
from .prefill_chunks import PendingPrefill
from .slot_cache import SlotCache, StepCache
from .step_inputs import batch_inputs, ragged_inputs, step_size
from .support import check_batchable

DEFAULT_CAPACITY = 2048  # positions per row when not given (prompt + answer)


@dataclass
class SlotKV(KV):
    """A request's place in the batched cache: ``row`` (moves when another row leaves),
    ``length`` committed columns. ``cache`` is unused (None)."""

    row: int = -1


@dataclass(frozen=True)
class RowStep:
    """What :meth:`BatchedEngine.commit` needs of one row's step: its ``[last, *tree]``
    tokens (for ``kv.ids``)."""

    tokens: list[int]
    drafted: int


class BatchedEngine:
    """Verification forwards of up to ``max_batch`` sequences at once over one cache.

    ``capacity``: positions per row for prompt + answer (None: the model's context
    window, at most :data:`DEFAULT_CAPACITY`). Memory: ``2 * layers * max_batch *
    (capacity + 1 + max bucket) * kv_heads * head_dim`` elements, allocated here.
    ``base``: the engine whose latency curve draft budgets read (the generator's).
    ``compiled``: True compiles the steps (in the background, from construction), False
    never, None where ``engine="auto"`` would (:attr:`why_eager` says why not); a
    compiling engine pads trees to ``buckets`` = :data:`~.compiled_step.TREE_SIZES`
    unless given.
    """

    def __init__(self, model: torch.nn.Module, *, max_batch: int = 16,
                 capacity: int | None = None, base: Engine | None = None,
                 lock: threading.Lock | None = None,
                 buckets: tuple[int, ...] | None = None,
                 compiled: bool | None = None) -> None:
        check_batchable(model)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        config = model.config
        window = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        capacity = min(window, DEFAULT_CAPACITY) if capacity is None else capacity
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 positions, got {capacity}")
        self.model = model
        self.base = base
        self.lock = lock or (base.lock if base is not None else threading.Lock())
        self.why_eager = _why_eager(model, compiled)
        compiling = self.why_eager is None
        if buckets is None:
            buckets = TREE_SIZES if compiling else BUCKETS
        if not buckets or min(buckets) < 1:
            raise ValueError(f"buckets must be positive node counts, got {buckets!r}")
        self.buckets = tuple(sorted(set(buckets)))
        self.max_batch = max_batch
        self.capacity = capacity
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        scratch = 1 + max(self.buckets)  # the largest step, written past a full row
        self.slots = SlotCache(config.num_hidden_layers, max_batch, kv_heads,
                               capacity + scratch, head_dim, model.dtype, model.device)
        self._rows: list[SlotKV] = []  # row r's request; len == active rows
        # a Llama on a CPU steps without module dispatch, its GQA packed (no repeat_kv);
        # None: the modules
        self.step = llama_step.for_model(model) if llama_step.applies(model) else None
        # that step's rows unpadded where its attention is the row-wise kernel's (see
        # cpu.ragged_attention); else padded to one size (a quantized model's fp64
        # attention, SDPA elsewhere)
        self.ragged = (self.step is not None and not self.step.fp64_attention
                       and rowwise_attention.applies(model.dtype, model.device, head_dim,
                                                     None))
        # the forward's cache keyword: "cache" or "past_key_values"
        self.cache_keyword = next(iter(cache_kwargs(model, None)))
        self.compiled: CompiledBatchedStep | None = None
        if compiling:  # compiled in the background; steps run eagerly until it is done
            self.compiled = CompiledBatchedStep(model, self.slots, max_batch, self.buckets,
                                                busy=self.lock.locked)
            self.compiled.request()

    # ---- the Engine verbs the generator's request set-up reads ------------------------
    def describe(self) -> EngineInfo:
        """``batched``; compiled once its shapes are ready; the direct Llama step or the
        model's own modules (a compiled step runs the modules)."""
        if self.compiled is not None and self.compiled.ready():
            return EngineInfo("batched", True, "modules")
        return EngineInfo("batched", False, "modules" if self.step is None else "llama-step")

    @property
    def unpadded(self) -> bool:
        """Whether a step of several rows runs unpadded now (eager, the row-wise kernel's
        attention; not once compiled steps are ready), so it costs its rows' own nodes."""
        ready = self.compiled is not None and self.compiled.ready()
        step = self.step
        return (self.ragged and not ready and step is not None
                and not llama_step.hooked(step.modules))

    @property
    def compiles(self) -> bool:
        """Whether the steps compile (ready or in the background); else :attr:`why_eager`."""
        return self.compiled is not None

    def warm_up(self, timeout: float | None = None) -> float:
        """Wait until the steps run compiled; seconds spent, 0.0 where they do not
        compile. RuntimeError when they could not be compiled in time."""
        if self.compiled is None:
            return 0.0
        start = time.perf_counter()
        if not self.compiled.wait(timeout):
            why = self.compiled.failed() or f"not within {timeout} s"
            raise RuntimeError(f"the batched steps could not be compiled ({why}); build "
                               "the batched engine with compiled=False")
        return time.perf_counter() - start

    @property
    def curve(self):
        """The base engine's latency curve (single-sequence forwards)."""
        if self.base is None:
            raise RuntimeError("a BatchedEngine built without a base engine has no curve")
        return self.base.curve

    def load_curve(self) -> None:
        if self.base is not None:
            self.base.load_curve()

    def refine_curve(self, seconds: Mapping[int, float]) -> None:
        """Never: batched steps do not cost what single ones do."""

    def finished(self) -> None:
        """A request ended: the process serves more, so the base engine's forward variants
        (the layouts a lone row runs) are measured in the idle time between answers, as
        a single engine's are (:mod:`~ngram_trie_rag.engine.costs.background_measure`;
        paused while a step holds the model's lock). Nothing is compiled for the base."""
        costs = getattr(self.base, "costs", None)
        if costs is not None:
            costs.measure_in_background()

    def depth_room(self, past_len: int) -> int:
        """Unlimited: a RoPE that follows the sequence length is refused when built."""
        return UNLIMITED

    def choose(self, prompt_len: int, new_tokens: int) -> BatchedEngine:
        """Itself, when the request fits a row; else ValueError with the numbers."""
        self.check_fits(prompt_len, new_tokens)
        return self

    def check_fits(self, prompt_len: int, new_tokens: int) -> None:
        if prompt_len + new_tokens > self.capacity:
            raise ValueError(
                f"a prompt of {prompt_len} tokens plus max_new_tokens={new_tokens} needs "
                f"{prompt_len + new_tokens} positions, more than this batched engine's "
                f"{self.capacity} per request; lower max_new_tokens or shorten the prompt, "
                "or build the scheduler with a larger capacity")

    # ---- rows -------------------------------------------------------------------------
    @property
    def active(self) -> int:
        """Rows in use (``0 .. active - 1``)."""
        return len(self._rows)

    @property
    def free(self) -> int:
        return self.max_batch - len(self._rows)

    @torch.inference_mode()
    def prefill(self, ids: list[int], new_tokens: int | None = None) -> tuple[SlotKV, torch.Tensor]:
        """Cache the prompt in a free row: its :class:`SlotKV` and the logits (V,) after its
        last token, from the model's plain forward (``generate``'s)."""
        pending = self.begin_prefill(ids, new_tokens)
        pending.advance()
        return pending.finish()

    def begin_prefill(self, ids: list[int], new_tokens: int | None = None) -> PendingPrefill:
        """A prompt to cache a chunk at a time (:class:`~.prefill_chunks.PendingPrefill`),
        checked to fit a row; it takes a free row only when :meth:`PendingPrefill.finish`
        is called."""
        self.check_fits(len(ids), new_tokens or 1)
        self._check_free()
        return PendingPrefill(self, list(ids))

    def take_row(self, ids: list[int], layer_keys: list[torch.Tensor],
                 layer_values: list[torch.Tensor]) -> SlotKV:
        """A free row holding a prefilled prompt (per layer keys/values (1, H, L, D))."""
        self._check_free()
        kv = SlotKV(None, len(ids), list(ids), row=len(self._rows))
        self.slots.load(kv.row, layer_keys, layer_values)
        self._rows.append(kv)
        return kv

    def _check_free(self) -> None:
        if not self.free:
            raise RuntimeError(f"all {self.max_batch} rows of the batched engine are in use")

    def release(self, kv: SlotKV) -> None:
        """Free ``kv``'s row: the last active row moves into it. Idempotent."""
        if kv.row < 0:
            return
        row, last = kv.row, self._rows[-1]
        if last is not kv:
            self.slots.move(last.row, row, last.length)
            last.row = row
            self._rows[row] = last
        self._rows.pop()
        kv.row = -1

    # ---- a step -----------------------------------------------------------------------
    @torch.inference_mode()
    def run_batch(self, rows: Sequence[tuple[SlotKV, int, DraftTree]]
                  ) -> tuple[list[RowStep], list[torch.Tensor]]:
        """One forward verifying every ``(kv, last, tree)``; per row (in the given order)
        its :class:`RowStep` and logits (1 + N_b, V). Rows of the cache not given but
        below the highest given row run as dummies."""
        given = {kv.row: (kv, last, tree) for kv, last, tree in rows}
        if any(r < 0 for r in given):
            raise ValueError("a row of this step was released")
        k = 1 + max(given)
        empty = DraftTree.empty()
        lasts, trees = [], []
        for r in range(k):
            _, last, tree = given.get(r, (None, 0, empty))
            if len(tree) > max(self.buckets):
                raise ValueError(f"a draft tree of {len(tree)} nodes exceeds the largest "
                                 f"bucket ({max(self.buckets)})")
            lasts.append(last)
            trees.append(tree)
        compiled, size = self.compiled, step_size(trees, self.buckets)
        padded = compiled.tree_size(size) if compiled is not None and compiled.ready() else None
        if padded is not None:
            # rows up to the batch bucket (the others dummies, in rows of their own), trees
            # to a compiled size, keys over every column: a compiled shape
            b, size = compiled.rows_for(k), padded
            lengths = [row.length for row in self._rows[:b]] + [0] * (b - len(self._rows))
            inputs = batch_inputs(lengths, lasts + [0] * (b - k), trees + [empty] * (b - k),
                                  size, self.model.device, self.model.dtype,
                                  width=self.slots.columns)
            return self._per_row(rows, compiled.run(inputs))
        if k > 1 and self.unpadded:
            return self._ragged(rows, k)
        step = self.step
        hooked = step is None or llama_step.hooked(step.modules)
        lengths = [self._rows[r].length for r in range(k)]
        # one row alone runs as the single engine's step would: its tree unpadded
        size = len(trees[0]) if k == 1 else size
        # the linear layout the base engine's curve chose for a forward of as many rows:
        # the products see k * (1 + N) rows, whichever sequences they belong to (on two
        # cores 4 rows x 1 took 44 ms transposed against 87 ms stock; 12 x 5, 203 ms
        # prepacked against 235 ms)
        layout = self.base.curve.layout(k * (1 + size)) if self.base else "stock"
        inputs = batch_inputs(lengths, lasts, trees, size, self.model.device,
                              self.model.dtype)
        cache = StepCache(self.slots.keys, self.slots.values, inputs.columns, inputs.width)
        if not hooked:
            logits = step.batch(inputs.ids, inputs.positions, inputs.mask, cache,
                                layout)  # (k, Q, V)
        else:
            logits = self.model(input_ids=inputs.ids, position_ids=inputs.positions,
                                attention_mask=inputs.mask, **{self.cache_keyword: cache},
                                use_cache=True).logits
        return self._per_row(rows, logits)

    def _ragged(self, rows: Sequence[tuple[SlotKV, int, DraftTree]], k: int
                ) -> tuple[list[RowStep], list[torch.Tensor]]:
        """:meth:`run_batch`'s eager step over rows ``0 .. k - 1`` unpadded: the products
        see each row's ``1 + N_b`` queries and no more (a row not given, none)."""
        given: list[tuple[int, int, DraftTree] | None] = [None] * k
        for kv, last, tree in rows:
            given[kv.row] = (kv.length, last, tree)
        inputs = ragged_inputs(given, self.model.device)
        cache = StepCache(self.slots.keys, self.slots.values, inputs.columns[None],
                          inputs.width, rows=inputs.rows[None], n=k)
        # the layout the base curve chose for a forward of as many product rows
        total = inputs.offsets[-1]
        layout = self.base.curve.layout(total) if self.base else "stock"
        logits = self.step.batch(inputs.ids, inputs.positions, None, cache, layout,
                                 ragged=inputs.attention)[0]  # (T, V)
        offsets = inputs.offsets
        return self._per_row(rows, lambda row, _: logits[offsets[row]: offsets[row + 1]])

    @staticmethod
    def _per_row(rows: Sequence[tuple[SlotKV, int, DraftTree]],
                 logits: torch.Tensor | Callable[[int, int], torch.Tensor]
                 ) -> tuple[list[RowStep], list[torch.Tensor]]:
        """Each given row's :class:`RowStep` and its real rows of ``logits`` (k', Q, V),
        or of what ``logits(row, 1 + N)`` gives for a row (an unpadded step's slice)."""
        rows_of = logits if callable(logits) else lambda row, q: logits[row, :q]
        steps, per_row = [], []
        for kv, last, tree in rows:
            steps.append(RowStep([last, *tree.tokens.tolist()], len(tree)))
            per_row.append(rows_of(kv.row, 1 + len(tree)))
        return steps, per_row

    @staticmethod
    def accept(step: RowStep, tree: DraftTree, logits: torch.Tensor, params, generator
               ) -> tuple[list[int], list[int]]:
        """``(tokens, path)`` of one row, as the single engines accept (host walk on a
        CPU, device walk elsewhere)."""
        inputs = StepInputs(None, None, None, "stock", False, step.drafted, step.tokens)
        return accept_step(inputs, tree, logits, params, generator)

    @torch.inference_mode()
    def commit(self, kv: SlotKV, step: RowStep, path: list[int]) -> None:
        """Keep ``last`` and the accepted ``path`` (query rows, 1-based) of one row."""
        self.commit_all([(kv, step, path)])

    @torch.inference_mode()
    def commit_all(self, commits: Sequence[tuple[SlotKV, RowStep, list[int]]]) -> None:
        """:meth:`commit` for many rows with one gather and one write per layer: the
        rows of ``last`` and each accepted path move to ``length_b ..`` of their row."""
        rows, src, dst = [], [], []
        for kv, step, path in commits:
            if path != list(range(1, len(path) + 1)):  # else in place already
                for i, p in enumerate(path, 1):
                    rows.append(kv.row)
                    src.append(kv.length + p)
                    dst.append(kv.length + i)
            kv.ids.append(step.tokens[0])
            kv.ids.extend(step.tokens[i] for i in path)
            kv.length += 1 + len(path)
        if rows:
            device = self.model.device
            self.slots.compact(torch.tensor(rows, device=device), torch.tensor(src, device=device),
                               torch.tensor(dst, device=device))


def _why_eager(model: torch.nn.Module, compiled: bool | None) -> str | None:
    """Why the steps of ``model`` run eagerly (None: they compile): ``compiled=False``,
    ``auto``'s reasons when None, and for True only what cannot compile at all."""
    from ..auto import why_eager
    from ..cpu import linear_layout
    from ..static_engine import check_compiled_quantized, cpp_compiler

    if compiled is False:
        return "compiled=False"
    check_compiled_quantized(model, bool(compiled))  # an fp32 one, as the static engine
    if linear_layout.installed(model):
        return "this model object has the eager engine's linear variants installed"
    if compiled is None:
        return why_eager(model)
    if model.device.type == "cpu" and not cpp_compiler():
        print("ngram-trie-rag: no C++ compiler on this host, which torch.compile needs on a "
              "CPU: the batched steps run eagerly", file=sys.stderr)
        return "no C++ compiler on this host"
    return None
