"""The w8a8 product of a few rows on an AVX512-VNNI CPU, built once per machine.

Why: a decode step multiplies 1 to 8 rows by every int8 matrix of the model. There
``torch._int_mm`` (oneDNN) costs about as much at 1 row as at 9, and the activations'
rounding around it is eight more tensor operations per layer. :file:`w8a8_vnni.cpp`
does both in one call (``vpdpbusd`` over the layer's own (N, K) int8 weights, no
copy). The 121 products a step of the default model runs, 2 threads of a Xeon with
AVX512-VNNI: 10-14 ms at one row, 18-20 ms at five, 24 ms at eight, against 24-31 ms
through the Python path at 1 to 8 rows. From about ten rows oneDNN is the faster
(its cost hardly grows with the rows), so products of more than :data:`MAX_ROWS` rows,
a prompt's included, stay there.

Same bits: the kernel runs the Python path's IEEE operations in its order, and its
integer sums are exact in any order, so a row's output is bitwise
:func:`~.kernels.int8_dynamic_product`'s (``tests/test_w8a8_vnni.py``). Which of the
two runs a product changes its time, never a token.

The C++ is compiled with PyTorch's extension builder (a C++ compiler and ninja) the
first time a w8a8 model is quantized on a machine, about 30 s, and loaded from
PyTorch's extension cache (``TORCH_EXTENSIONS_DIR``) after that. Where the CPU has no
AVX512-VNNI the Python path runs; where the build fails, a warning names the reason
and the Python path runs.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAX_ROWS = 8  # the most rows a product sends to the kernel (oneDNN's is faster beyond)
SOURCE = Path(__file__).with_name("w8a8_vnni.cpp")
# -fopenmp: ATen's parallel_for is OpenMP in its headers (without it, one thread);
# -fno-tree-pre: GCC 12 otherwise copies every accumulator at every step of the K loop
FLAGS = ("-O2", "-fno-tree-pre", "-ffp-contract=off", "-fopenmp", "-mavx512f", "-mavx512bw",
         "-mavx512vnni")

Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_LOCK = threading.Lock()
_KERNEL: list[Product | None] = []  # [] until tried; then [the kernel] or [None]


def supported_cpu() -> bool:
    """True on an x86-64 CPU with AVX512-VNNI (the instructions the kernel uses)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    found = torch.cpu.get_capabilities()
    return all(found.get(flag, False) for flag in ("avx512_f", "avx512_bw", "avx512_vnni"))


def kernel() -> Product | None:
    """The built kernel (``w8a8_product(x, qweight, scale, comp)``), or None where the
    CPU lacks AVX512-VNNI or the build failed (warned once). Builds on the first call
    in a process that finds no cached build; thread-safe."""
    if _KERNEL:
        return _KERNEL[0]
    with _LOCK:
        if not _KERNEL:
            _KERNEL.append(_build() if supported_cpu() else None)
    return _KERNEL[0]


def _build() -> Product | None:
    from torch.utils import cpp_extension

    text = SOURCE.read_bytes()
    key = hashlib.sha256(text + " ".join(FLAGS).encode() + torch.__version__.encode())
    name = f"ngram_trie_rag_w8a8_{key.hexdigest()[:12]}"
    start = time.perf_counter()
    log.info("loading the w8a8 VNNI kernel %s (compiled once per machine, about 30 s)", name)
    try:
        module = cpp_extension.load(name, [str(SOURCE)], extra_cflags=list(FLAGS),
                                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as error:  # no compiler, no ninja, a failed build: the Python path
        log.warning("the w8a8 VNNI kernel did not build (%s: %s); w8a8 products run "
                    "through torch._int_mm, with the same results, slower at 1-8 rows. "
                    "A C++ compiler and ninja (pip install ninja) let it build",
                    type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return None
    log.info("w8a8 VNNI kernel ready in %.1f s", time.perf_counter() - start)
    return module.w8a8_product
