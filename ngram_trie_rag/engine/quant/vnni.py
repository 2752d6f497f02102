"""The w8a8 product of a few rows on an AVX512-VNNI CPU, built once per machine.

Why: a decode step multiplies 1 to 8 rows by every int8 matrix of the model. There
``torch._int_mm`` (oneDNN) costs about as much at 1 row as at 9, and the activations'
rounding around it is eight more tensor operations per layer. :file:`w8a8_vnni.cpp`
does both in one call (``vpdpbusd`` over the layer's own (N, K) int8 weights, no
copy), prefetching the weights two blocks ahead. The 121 products a step of the
default model runs, 2 threads of a Xeon with AVX512-VNNI: 6.4 ms at one row, 10.7 ms at
four, 12.6 ms at eight (7.5, 12.5 and 17.5 without the prefetch, same run), against
22-26 ms through the Python path at 1 to 8 rows. From about ten rows oneDNN is the faster
(its cost hardly grows with the rows), so products of more than :data:`MAX_ROWS` rows,
a prompt's included, stay there.

Same bits: the kernel runs the Python path's IEEE operations in its order, and its
integer sums are exact in any order, so a row's output is bitwise
:func:`~.kernels.int8_dynamic_product`'s (``tests/test_w8a8_vnni.py``). Which of the
two runs a product changes its time, never a token.

It is built the first time a model is quantized to w8a8 on a machine and loaded from
the cache after that (:mod:`.native`); its OpenMP team is the size of PyTorch's
intra-op threads at each call. Where the CPU has no AVX512-VNNI the Python
path runs; where the compiler is missing or fails, a warning names the reason and the
Python path runs.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from . import native

log = logging.getLogger(__name__)

MAX_ROWS = 8  # the most rows a product sends to the kernel (oneDNN's is faster beyond)
SOURCE = Path(__file__).with_name("w8a8_vnni.cpp")
# -fno-tree-pre: GCC 12 otherwise copies every accumulator at every step of the K loop
FLAGS = ("-O2", "-fno-tree-pre", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw",
         "-mavx512vnni", "-shared", "-fPIC")

Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Product | None] = []  # [] until tried; then [the kernel] or [None]


def supported_cpu() -> bool:
    """True on an x86-64 CPU with AVX512-VNNI (the instructions the kernel uses)."""
    return native.x86_with("avx512_f", "avx512_bw", "avx512_vnni")


def kernel() -> Product | None:
    """The built kernel (``w8a8_product(x, qweight, scale, comp)``), or None where the
    CPU lacks AVX512-VNNI or the build failed (warned once). Builds on the first call
    in a process that finds no cached build; thread-safe."""
    return native.once(_KERNEL, _LOCK, lambda: _build() if supported_cpu() else None)


def library_path(compiler: str) -> Path:
    """Where the kernel built by ``compiler`` is cached: named by the source and flags."""
    return native.library_path(SOURCE, FLAGS, compiler)


def _build() -> Product | None:
    try:
        function = native.load(SOURCE, FLAGS, "ntr_w8a8_product", log)
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("the w8a8 VNNI kernel is not available (%s); w8a8 products run through "
                    "torch._int_mm, with the same results, slower at 1-8 rows",
                    native.why(error))
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int]

    def product(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                comp: torch.Tensor) -> torch.Tensor:
        """x (M, K) fp32, qweight (N, K) int8, scale (N,) fp32, comp (N,) int32, all
        contiguous on the CPU: y (M, N) fp32, or an empty tensor when a row is not
        finite."""
        rows, n = x.shape[0], qweight.shape[0]
        y = x.new_empty((rows, n))
        failed = function(x.data_ptr(), rows, x.shape[1], qweight.data_ptr(), n,
                          scale.data_ptr(), comp.data_ptr(), y.data_ptr(),
                          torch.get_num_threads())
        return y.new_empty(0) if failed else y

    return product
