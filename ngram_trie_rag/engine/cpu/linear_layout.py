"""Linear layers over a few rows as ``W @ x^T`` where that is the faster matrix product.

A ``torch.nn.Linear`` computes ``x @ W^T``: for a verification forward ``x`` has
``Q = 1 + N`` rows (the tree) and ``W`` is ``(out, in)``. With few rows this is a
matrix-vector or skinny product that is memory-bound: it should cost one read of
``W``. On some CPU BLAS builds it does not. Measured here (2 cores, fp32, MKL, the
default model's lm_head ``(49152, 576)``, 113 MB): ``x @ W^T`` takes 10 / 22 / 33 /
17 ms for 1 / 2 / 3 / 4 rows, while the same product as ``W @ x^T`` takes 4.4 / 8.5 /
4.0 ms for 2 / 3 / 4 rows, about one read of ``W`` at full memory bandwidth. A
single row also runs faster as a two-column ``W @ [x, x]^T`` than as a vector product.
bf16 on the same CPU shows no such gap (oneDNN takes those products).

Whether and for which forward sizes the transposed layout wins is a property of the
hardware, the BLAS and the dtype, so it is measured, not assumed: the latency curve
(:func:`ngram_trie_rag.engine.costs.latency.latency_curve`) times each forward size both ways and
the generator runs each of its forwards in the faster layout (:func:`transposed`).
Only the generator's own forwards switch: :func:`install` (called when a generator is
built over a model whose modules it runs) gives each plain linear layer a forward that
is ``F.linear`` itself, as ``nn.Linear`` computes it, unless the call runs inside
:func:`transposed` in the same thread or task (a ContextVar). So ``generate`` and
anything else sharing the model runs exactly as shipped, and no forward mutates it.

A third layout, *prepacked*, hands the products to oneDNN over copies of the weights
in its blocked format (:func:`prepacked`). In bf16 on the same CPU the default model's
30 layers of one-row products take 14.5 ms that way against 20.7 ms stock (lm_head
2.4 against 4.7 ms), and 16-17 ms against 33 ms for four rows; in fp32 it wins only
for larger trees. It costs a copy of every linear weight (270 MB for the default model
in bf16), so it is offered only where that copy fits in a quarter of the free memory
(:func:`prepack_applies`), and only to the Llama step
(:mod:`ngram_trie_rag.engine.cpu.llama_step`), which keeps the copies and re-packs when a weight
changes in place.

The layouts sum the same products in different orders, so logits differ in the last
bits (as batched and one-token forwards already do); greedy equality with
``generate`` is what the exactness tests check.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
_LINEARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TRANSPOSED: ContextVar[bool] = ContextVar("ngram_trie_rag_transposed", default=False)
_INSTALL = threading.Lock()
_INSTALLED: weakref.WeakSet = weakref.WeakSet()  # models install() has set up


def linear_transposed(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``self(x)`` computed as ``(W @ x^T)^T``. x (..., in) -> (..., out)."""
    out = transposed_product(x, self.weight)
    return out if self.bias is None else out + self.bias


def transposed_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)``, bias-free, computed as ``(weight @ x^T)^T``.
    x (..., in) -> (..., out)."""
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])  # (M, in)
    if rows == 1:  # a vector product misses the blocked kernel: use two equal columns
        flat = torch.cat((flat, flat))
    # (out, in) @ (in, M) -> (out, M) -> (M, out), made row-major again: a column-major
    # result would reach the next layer's product as a column-major operand, which
    # the same BLAS runs about five times slower.
    out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
    return out.reshape(*x.shape[:-1], weight.shape[0])


def prepacked(weight: torch.Tensor) -> torch.Tensor:
    """A oneDNN copy of ``weight`` (out, in) in the blocked format its matrix-vector
    kernel reads fastest. A copy: it does not follow later in-place changes."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # tuned for few rows


def prepacked_product(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)``, bias-free, over :func:`prepacked` weights.
    x (..., in) -> (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def prepack_applies(model: torch.nn.Module, share_of_free_memory: float = 0.25) -> bool:
    """True when the model has plain float linear layers on a CPU (not quantized ones),
    oneDNN can run their dtype here, and a prepacked copy of them fits in
    ``share_of_free_memory`` of the memory available now."""
    if (not applies(model) or model.dtype not in (torch.float32, torch.bfloat16)
            or not prepack_runs(model.dtype)):
        return False
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not reported here: do not copy
        return False
    need = sum(m.weight.numel() * m.weight.element_size() for m in plain_linears(model))
    return need <= share_of_free_memory * free


@functools.cache
def prepack_runs(dtype: torch.dtype) -> bool:
    """True when oneDNN packs and multiplies ``dtype`` weights on this CPU. Its bf16
    kernels need AVX-512 (or AVX-NE-CONVERT): on an AVX2-only CPU packing raises, and
    the prepacked layout is then simply not offered."""
    if (not torch.backends.mkldnn.is_available()
            or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        weight = torch.ones(16, 16, dtype=dtype)
        prepacked_product(torch.ones(1, 16, dtype=dtype), prepacked(weight))
    except (RuntimeError, NotImplementedError) as error:
        log.debug("oneDNN cannot prepack %s weights here: %s", dtype, error)
        return False
    return True


def applies(model: torch.nn.Module) -> bool:
    """True when the model is on a CPU with plain floating-point linear layers."""
    return model.device.type == "cpu" and bool(plain_linears(model))


def plain_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain ``nn.Linear`` layers (subclasses and quantized weights, e.g.
    torchao's tensor subclasses, excluded)."""
    found = _LINEARS.get(model)
    if found is None:
        found = [m for m in model.modules() if type(m) is torch.nn.Linear
                 and m.weight.dim() == 2 and dense(m.weight)]
        _LINEARS[model] = found
    return found


def dense(weight: torch.Tensor) -> bool:
    """A plain floating-point tensor (not a quantized tensor subclass, e.g. torchao's)."""
    return type(weight) in (torch.Tensor, torch.nn.Parameter) and weight.dtype.is_floating_point


def _gated_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, or :func:`linear_transposed` inside :func:`transposed`."""
    if _TRANSPOSED.get():
        return linear_transposed(self, x)
    return F.linear(x, self.weight, self.bias)


def install(model: torch.nn.Module) -> None:
    """Give the model's plain linear layers the gated forward. Idempotent."""
    with _INSTALL:
        for layer in plain_linears(model):
            if "forward" not in layer.__dict__:
                layer.forward = _gated_forward.__get__(layer)
        _INSTALLED.add(model)


def installed(model: torch.nn.Module) -> bool:
    return model in _INSTALLED


@contextmanager
def transposed(enabled: bool) -> Iterator[None]:
    """Installed linear layers called inside, in this thread or task, compute
    :func:`linear_transposed` when ``enabled``."""
    if not enabled:
        yield
        return
    token = _TRANSPOSED.set(True)
    try:
        yield
    finally:
        _TRANSPOSED.reset(token)
