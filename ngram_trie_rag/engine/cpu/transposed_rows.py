"""The transposed linear layout inside a compiled step, for the row counts it pays at.

A CPU BLAS may run a linear layer over a few rows, ``x @ W^T``, at half the memory
bandwidth it reaches as ``W @ x^T`` (:mod:`~ngram_trie_rag.engine.cpu.linear_layout` has the
figures). The base engine switches its modules with a ContextVar, which Dynamo does not
trace. A compiled step instead runs its forward inside :class:`TransposedRows`, a
``TorchFunctionMode`` that Dynamo traces: every ``F.linear`` over an input of a listed
row count becomes :func:`~ngram_trie_rag.engine.cpu.linear_layout.transposed_product` (plus
the bias) in the graph itself, at no cost per call. Mode stacks are per thread, so
``generate`` or any other caller of the same model, on any thread, runs as shipped.

Which row counts are listed is measured (:func:`faster_transposed`, once per process
and model shape): every linear layer's product is timed both ways at each of the step's
row counts, and the transposed layout is taken where the whole set runs faster by
``LAYOUT_MARGIN``. Qwen2-shaped default-size model, 2 cores, fp32, one row: 20-28 ms
against 51-54 ms. Compiled with it, plain decoding of the Llama- and Mistral-shaped
models took 30 ms a token against 65-72 ms through the eager engine
(``scripts/compiled_families.py --speed``; docs/gpu.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..costs.latency import LAYOUT_MARGIN
from . import linear_layout
from .linear_layout import transposed_product


class TransposedRows(TorchFunctionMode):
    """Inside, ``F.linear(x, W, b)`` with ``x`` of a row count in ``rows`` (rows: the
    product of x's leading dimensions) and a 2-D floating-point ``W`` computes
    ``transposed_product(x, W) + b``; every other call runs unchanged."""

    def __init__(self, rows: frozenset[int]) -> None:
        super().__init__()
        self.rows = rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x = args[0] if args else kwargs["input"]
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if (x.shape[-1] and x.numel() // x.shape[-1] in self.rows
                    and weight.dim() == 2 and weight.dtype.is_floating_point):
                out = transposed_product(x, weight)
                return out if bias is None else out + bias
        return func(*args, **kwargs)


_CHOSEN: dict[tuple, frozenset[int]] = {}  # per weight shapes, dtype, threads, counts
_GUARD = threading.Lock()


def faster_transposed(model: torch.nn.Module, row_counts: Iterable[int],
                      repeats: int = 3) -> frozenset[int]:
    """The row counts at which the model's linear products run faster transposed by
    ``LAYOUT_MARGIN`` (:func:`_measure`), measured once per process for a set of weight
    shapes, dtype, intra-op thread count and row counts. Empty off a CPU, or for a model
    without plain linear layers."""
    if not linear_layout.applies(model):
        return frozenset()
    weights = [m.weight for m in linear_layout.plain_linears(model)]
    key = (tuple(tuple(w.shape) for w in weights), weights[0].dtype,
           torch.get_num_threads(), tuple(sorted(set(row_counts))))
    with _GUARD:
        if key not in _CHOSEN:
            _CHOSEN[key] = _measure(weights, key[-1], repeats)
        return _CHOSEN[key]


@torch.inference_mode()
def _measure(weights: list[torch.Tensor], row_counts: tuple[int, ...],
             repeats: int) -> frozenset[int]:
    """Per row count (ascending), every weight's product once (each weight read from
    memory, as a step reads it), each layout's fastest of ``repeats`` after a warm-up,
    interleaved so that drift hits both. The first count where the transposed layout
    runs no faster at all ends the search: its lead shrinks as rows grow (fp32, 2
    cores: 28 against 54 ms at one row, 63 against 83 at nine, 91 against 98 at
    seventeen)."""
    faster = set()
    for rows in row_counts:
        inputs = {n: torch.randn(rows, n, dtype=weights[0].dtype)
                  for n in {w.shape[1] for w in weights}}
        best = {"stock": float("inf"), "transposed": float("inf")}
        for run in range(repeats + 1):
            for layout, product in (("stock", F.linear), ("transposed", transposed_product)):
                start = time.perf_counter()
                for weight in weights:
                    product(inputs[weight.shape[1]], weight)
                if run:
                    best[layout] = min(best[layout], time.perf_counter() - start)
        if best["transposed"] >= best["stock"]:
            break
        if best["transposed"] < LAYOUT_MARGIN * best["stock"]:
            faster.add(rows)
    return frozenset(faster)
