"""The *rowwise* layout of the Llama step for fp32 models: products in this package's
AVX-512 kernel, and each decoder layer in the fused layer's two C++ calls around
row-wise attention.

Why: a verification forward multiplies ``1 + N`` rows by every weight, and at a few
rows that product should cost one read of the weights. The CPU BLAS's fp32 products
do not: on two cores of a Xeon the default model's 121 products take 29 ms at one row
but 53 ms at four and 67 ms at eight, in the better of ``x W^T`` and ``W x^T``
(:mod:`~ngram_trie_rag.engine.cpu.linear_layout`). The W8A32 kernel's fp32 twin
(``ntr_w32a32_product`` in :file:`../quant/w8a32_avx512.cpp`) loads each weight once
for a block of up to eight rows and prefetches the weights ahead: 29 / 30 / 36 ms for
1 / 4 / 8 rows (16 rows: 59 against 72 ms). The rest of a step was then mostly
dispatch (some forty tensor operations a layer) and SDPA: 20 ms of a one-row step
after 1,000 cached tokens, 43 ms at seventeen rows. So up to
:data:`~ngram_trie_rag.engine.quant.fused_layer.MAX_ROWS` rows a layer runs as
:class:`~ngram_trie_rag.engine.quant.fused_layer.FusedLayer`'s two calls over the
layer's own weights (RMSNorm, q/k/v and RoPE; o_proj, residual, RMSNorm, gate/up,
SiLU, down_proj, residual) around the cache update and
:mod:`~ngram_trie_rag.engine.quant.rowwise_attention`, as a quantized fp32 model's
layers run; more rows (a long prompt chunk) take the modules' operations with these
products.

Every operation computes each row alone in one fixed order, so a row's logits are
bitwise the same alone or beside other rows. It is not the BLAS's or SDPA's order:
logits differ from the stock layout's in the last bits (about 1e-6), as the transposed
and prepacked layouts' do, and greedy equality with ``generate`` is what the exactness
tests check. Like the other layouts it is chosen per forward size by the latency curve
(a process without a stored curve probes it too), and only the engines' Llama step runs
it; ``generate`` and the modules are untouched.

It applies to fp32 models on an x86-64 CPU with AVX-512 (F, BW, VL) whose plain linear
weights are contiguous, and needs the system's C++ compiler once per machine
(:mod:`~ngram_trie_rag.engine.quant.native`); where the build fails a warning names the
reason and the layout is not offered.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable

import torch

from ..quant import native, w8a32
from . import linear_layout

log = logging.getLogger(__name__)

SYMBOL = "ntr_w32a32_product"
# The most rows the layout is offered for: past it the BLAS's blocked products win (32
# rows: 103 ms here against 92 ms transposed).
MAX_ROWS = 33

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Product | None] = []  # [] until tried; then [the kernel] or [None]


def kernel() -> Product | None:
    """``product(x (M, K), weight (N, K)) -> (M, N)``, all fp32 and contiguous, or None
    where the CPU lacks AVX-512 or the build failed (warned once); thread-safe."""
    return native.once(_KERNEL, _LOCK, lambda: _build() if w8a32.supported_cpu() else None)


def _build() -> Product | None:
    try:
        function = native.load(w8a32.SOURCE, w8a32.FLAGS, SYMBOL, log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the fp32 few-row product kernel is not available (%s); fp32 forwards "
                    "use the BLAS's products", native.why(error))
        return None
    product = native.weight_product(function)  # the fp32 kernel reads no scales
    return lambda x, weight: product(x, weight, None)


def applies(model: torch.nn.Module) -> bool:
    """True for an fp32 model on a CPU whose plain linear weights are all contiguous,
    where the kernel is built (building it on the first call)."""
    if model.dtype != torch.float32 or not linear_layout.applies(model):
        return False
    if not all(m.weight.is_contiguous() for m in linear_layout.plain_linears(model)):
        return False
    return kernel() is not None


def address() -> int:
    """The kernel's C address, for the fused decoder layer's products (built: see
    :func:`applies`)."""
    from ..quant.fused_layer import kernel_address

    return kernel_address(w8a32, SYMBOL)


def rowwise_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)``, bias-free, in the kernel (built: see :func:`applies`).
    x (..., in) fp32 -> (..., out)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()  # (M, in)
    return kernel()(flat, weight).view(*x.shape[:-1], weight.shape[0])
