"""The batched step compiled: two graphs per tree size (one row; more, the batch dynamic),
CUDA graphs on a GPU.

An eager batched step takes a new shape nearly every step (its rows, its padded tree, its
widest row), and on a GPU a small model's step is bound by kernel launches, not by the
device (the eager single-sequence bf16 step ran at 0.54x ``generate`` on an H200, the
compiled one at 11x: docs/gpu.md). :class:`CompiledBatchedStep` fixes all three sizes:

- rows: a step of ``k`` rows runs ``b`` = the smallest batch bucket (1, 2, 4, ...,
  ``max_batch``) that holds them; rows ``k .. b - 1`` run as dummies over their own cache
  rows, writing past their committed length, where no request reads;
- the tree: padded to one of ``tree_sizes`` (the engine's buckets), a step without drafts
  to the smallest: on a GPU a few more query rows cost next to nothing, and every size is
  two more compiles;
- keys: every column of a row (``capacity + scratch``); the mask hides the rest.

The batch dimension of rows 2 and up is one dynamic size (``torch._dynamo.mark_dynamic``),
so Inductor compiles two graphs per tree size (one row, and 2 .. ``max_batch`` rows:
measured on a tiny Llama, one graph served 2, 3 and 4 rows with no recompile), each
traced with ``torch.compile(fullgraph=True, dynamic=False)`` (``mode="reduce-overhead"``
on CUDA, which records a CUDA graph per batch bucket). They are compiled on a background thread
(:mod:`~ngram_trie_rag.engine.compiling.background_compile`) over scratch buffers of the
cache's shape, so no live row is touched, while the engine steps eagerly; once every
shape is compiled, each step that fits one runs compiled. What compiling produced is
stored per machine (:mod:`~ngram_trie_rag.engine.compiling.artifacts`), so the next
process only traces. A graph's rows are computed by the same kernels whatever the other
rows hold; in fp32 a row's greedy tokens are its ``generate`` tokens either way (tested),
and in bf16 the eager and compiled steps may round a near-tie apart, as the batched
engine's rows already may.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Sequence

import numpy as np
import torch

from ...drafting.draft_tree import DraftTree
from ..compiling import artifacts
from ..compiling.background_compile import BackgroundCompiler, check_not_stopping
from ..compiling.cudagraph_threads import cudagraph_trees_for_this_thread
from ..compiling.own_code import own_code
from ..costs.latency import sync_device
from ..cpu import gqa_attention, openmp_team
from ..kv_cache import cache_kwargs
from .slot_cache import SlotCache, StepCache
from .step_inputs import BatchInputs, batch_inputs

# Tree sizes compiled by default: the cap chooser picks among 0 and these under load, and
# a lone row's draft (at most ``num_draft`` = 32 nodes by default) fits the largest. Each
# size costs two compiles (one row, and the dynamic batch), 30-60 s each on a GPU.
TREE_SIZES = (8, 32)
log = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Powers of two below ``max_batch``, then ``max_batch``: (1, 2, 4, 8, 16) for 16."""
    sizes = itertools.takewhile(lambda b: b < max_batch, (1 << i for i in itertools.count()))
    return (*sizes, max_batch)


class CompiledBatchedStep:
    """The compiled forward of a batched step over ``slots`` (see the module's notes).

    ``tree_sizes``: the padded node counts compiled; ``busy()``: whether a step
    is running, which the background compile yields to."""

    def __init__(self, model: torch.nn.Module, slots: SlotCache, max_batch: int,
                 tree_sizes: Sequence[int], busy=lambda: False) -> None:
        self.model = model
        self.slots = slots
        self.batch_sizes = batch_buckets(max_batch)
        self.tree_sizes = tuple(sorted(set(tree_sizes)))
        self.cudagraphs = model.device.type == "cuda"
        self._keyword = next(iter(cache_kwargs(model, None)))  # "cache" or "past_key_values"
        # on a CPU, masked grouped-query attention over the cache as stored (no repeat_kv),
        # asked for by a keyword the graph traces (see the module it comes from)
        self._attention_kwargs = {}
        if gqa_attention.applies(model):
            gqa_attention.install(model)
            self._attention_kwargs = {gqa_attention.PACKING_KEYWORD: "masked"}
        if self.cudagraphs:  # buffers CUDA graphs read in place (re-recorded if they move)
            for buf in (*slots.keys, *slots.values):
                torch._dynamo.mark_static_address(buf)
        config = torch._dynamo.config
        need = 2 * len(self.shapes())  # the scratch buffers' graphs, then the live ones'
        for name, limit in (("cache_size_limit", need), ("recompile_limit", need),
                            ("accumulated_recompile_limit", 16 * need)):
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), limit))
        # dynamic=False: no shape turns dynamic on its own (a tree size's graph stays
        # specialised); only the batch dimension marked in _batch_dynamic is
        self._fn = torch.compile(own_code(self._forward), fullgraph=True, dynamic=False,
                                 mode="reduce-overhead" if self.cudagraphs else None)
        self.max_batch = max_batch
        self._compiler = BackgroundCompiler(self._compile_all, "batched step shapes", busy)
        self.calls = 0  # compiled steps run (the tests count them)

    def shapes(self) -> list[tuple[int, int]]:
        """(rows, padded nodes) of every step shape, smallest first (rows 2 and up share
        a graph per tree size; on CUDA each shape records a CUDA graph)."""
        return [(b, n) for b in self.batch_sizes for n in self.tree_sizes]

    def rows_for(self, k: int) -> int:
        """The batch bucket a step of ``k`` rows runs (``k <= max_batch``)."""
        return next(b for b in self.batch_sizes if b >= k)

    def tree_size(self, nodes: int) -> int | None:
        """The compiled tree size a step of at most ``nodes`` nodes per row pads to (0
        included); None when larger than all (that step runs eagerly)."""
        return next((n for n in self.tree_sizes if n >= nodes), None)

    # ---- compiling --------------------------------------------------------------------
    def request(self) -> None:
        """Compile every shape on the background thread (once)."""
        self._compiler.request(self.slots.columns)

    def ready(self) -> bool:
        """Whether every shape is compiled and steps may run compiled."""
        return self._compiler.ready(self.slots.columns)

    def failed(self) -> str | None:
        return self._compiler.failed(self.slots.columns)

    def wait(self, timeout: float | None = None) -> bool:
        """Compile every shape now (if not yet) and wait: True once they are ready."""
        return self._compiler.wait(self.slots.columns, timeout)

    def artifact_key(self) -> str:
        """Where what compiling produced is stored for the next process on this machine."""
        return artifacts.artifact_key(self.model, self.slots.columns,
                                      [f"{b}x{n}" for b, n in self.shapes()],
                                      "batched-cudagraphs" if self.cudagraphs
                                      else "batched-inductor")

    def _compile_all(self, columns: int) -> None:
        """Call the compiled step once per shape over scratch buffers of the cache's shape
        (a row per bucket row, each a chain after one cached token); progress to the log;
        then store what compiling produced."""
        key = self.artifact_key()
        stored = artifacts.load(key)
        shapes = self.shapes()
        log.info("compiling %d batched step shapes (%s)", len(shapes),
                 "from the stored compile" if stored is not None else "first compile here")
        if self.cudagraphs:
            cudagraph_trees_for_this_thread()
        device = self.model.device
        on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        started = time.perf_counter()
        first = self.slots.keys[0]
        # inference tensors where the live buffers are (a graph guards on that too)
        with on_device, torch.inference_mode(first.is_inference()):
            scratch = SlotCache(len(self.slots.keys), first.shape[0], first.shape[1], columns,
                                first.shape[3], first.dtype, device)
        if self.cudagraphs:
            for buf in (*scratch.keys, *scratch.values):
                torch._dynamo.mark_static_address(buf)
        with on_device, torch.inference_mode():
            for i, (b, n) in enumerate(shapes, 1):
                check_not_stopping()  # the interpreter is exiting: no new shape
                start = time.perf_counter()
                inputs = _scratch_inputs(b, n, columns, self.model)
                self._fn(*self._batch_dynamic(inputs), scratch.keys, scratch.values)
                sync_device(device)
                openmp_team.release()  # no forward here while the next shape compiles
                log.info("compiled batched step shape %d/%d (rows %d, draft nodes %d) in "
                         "%.1f s", i, len(shapes), b, n, time.perf_counter() - start)
        log.info("compiled %d batched step shapes in %.1f s", len(shapes),
                 time.perf_counter() - started)
        if stored is None:
            artifacts.save(key, {}, [])

    # ---- a step -----------------------------------------------------------------------
    def run(self, inputs: BatchInputs) -> torch.Tensor:
        """Logits (b, Q, V) of a step whose inputs are padded to a compiled shape (rows
        to a batch bucket, nodes to a tree size, keys to every column)."""
        if self.cudagraphs:  # the scheduler's thread records and replays its own graphs
            cudagraph_trees_for_this_thread()
        self.calls += 1
        tensors = self._batch_dynamic((inputs.ids, inputs.positions, inputs.mask,
                                       inputs.columns))
        logits = self._fn(*tensors, self.slots.keys, self.slots.values)
        return logits.clone() if self.cudagraphs else logits  # a replay reuses its output

    def _batch_dynamic(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Mark the batch dimension of a step of 2 rows or more dynamic (2 ..
        ``max_batch``): one graph for all of them; one row keeps a graph of its own."""
        if self.max_batch > 2 and tensors[0].shape[0] > 1:
            for t in tensors:
                torch._dynamo.mark_dynamic(t, 0, min=2, max=self.max_batch)
        return tensors

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 columns: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]) -> torch.Tensor:
        """The code Dynamo traces: the model's modules over a :class:`StepCache` that
        writes each row's step at its columns and attends over every column."""
        cache = StepCache(keys, values, columns, keys[0].shape[2])
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                         **{self._keyword: cache}, use_cache=True, **self._attention_kwargs)
        return out.logits


def _scratch_inputs(b: int, n: int, columns: int, model: torch.nn.Module):
    """Inputs of a (``b`` rows, ``n`` nodes) step over scratch buffers: every row one
    cached token, then a chain of ``n`` nodes."""
    chain = DraftTree(np.arange(2, 2 + n), np.arange(-1, n - 1), np.arange(1, n + 1))
    inputs = batch_inputs([1] * b, [1] * b, [chain] * b, n, model.device, model.dtype,
                          width=columns)
    return inputs.ids, inputs.positions, inputs.mask, inputs.columns
