"""The int8 weight-only product with fp32 activations on an AVX-512 CPU, built once
per machine.

Why: an fp32 model quantized to int8 keeps its activations in fp32, as a weight-only
scheme means to; but aten's ``_weight_int8pack_mm`` takes fp32 activations through a
scalar path (22 ms against 1.9 ms in bf16 for the default model's lm_head), so without
this kernel int8 layers round their rows to bf16 (W8A16, :class:`~.linear.Int8Linear`).
:file:`w8a32_avx512.cpp` multiplies fp32 rows by the layer's own (N, K) int8 weights,
widened in registers. The 121 products of one step of the default model, 2 threads of
a Xeon, in one run: 9.4 ms at one row, 12.1 ms at four, 19.8 at eight, 42.5 at sixteen,
against 17.4, 25.1, 46.6 and 90.6 ms for ``_weight_int8pack_mm`` with bf16 rows.

Rows apart: every output is summed in one fixed order whatever else is in the call
(see the source), so each row's output is bitwise its output alone, for any number of
rows (``tests/test_w8a32.py``): a tree verification's rows equal ``generate``'s one-row
steps. Products of more than :data:`MAX_ROWS` rows (a prompt's) go to the BLAS's fp32
product over the weights dequantized instead, as the float model's prompt does: at 660
rows the kernel takes 1.35x its time (1105 against 816 ms for the default model's 120
layer products), and a prompt is computed the same way in ``generate`` and the engines.

It is built the first time a model is quantized to int8 on such a CPU (:mod:`.native`);
its OpenMP team is the size of PyTorch's intra-op threads at each call. Where the CPU
has no AVX-512 (F, BW, VL), int8 layers are W8A16; where the compiler is missing or
fails, a warning names the reason and they are W8A16 too.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from . import native

log = logging.getLogger(__name__)

MAX_ROWS = 128  # the most rows a product sends to the kernel (BLAS's fp32 product beyond)
SOURCE = Path(__file__).with_name("w8a32_avx512.cpp")
SYMBOL = "ntr_w8a32_product"
# -fno-tree-pre: GCC 12 otherwise copies every accumulator at every step of the K loop;
# -ffp-contract=off: the multiply-adds are the source's own, never contracted otherwise
FLAGS = ("-O2", "-fno-tree-pre", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw",
         "-mavx512vl", "-shared", "-fPIC")

Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Product | None] = []  # [] until tried; then [the kernel] or [None]


def supported_cpu() -> bool:
    """True on an x86-64 CPU with AVX-512 F, BW and VL (the instructions the kernel uses)."""
    return native.x86_with("avx512_f", "avx512_bw", "avx512_vl")


def kernel() -> Product | None:
    """The built kernel (``product(x, qweight, scale)``), or None where the CPU lacks
    AVX-512 or the build failed (warned once). Builds on the first call in a process
    that finds no cached build; thread-safe."""
    return native.once(_KERNEL, _LOCK, lambda: _build() if supported_cpu() else None)


def _build() -> Product | None:
    try:
        function = native.load(SOURCE, FLAGS, SYMBOL, log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the int8 fp32-activation kernel is not available (%s); int8 layers "
                    "take bf16 activations (W8A16) instead", native.why(error))
        return None
    return native.weight_product(function)  # product(x, qweight, scale)


@torch.library.custom_op("ngram_trie_rag::w8a32_product", mutates_args=())
def traced_product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The kernel as an operator ``torch.compile`` keeps whole in its graph (a ctypes call
    would break the graph): the same bits. Eager forwards call the kernel directly, which
    saves the operator's dispatch."""
    product = kernel()
    if product is None:
        raise RuntimeError("the int8 fp32-activation kernel is not built on this machine")
    return product(x.contiguous(), qweight.contiguous(), scale.contiguous())


@traced_product.register_fake
def _(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))
