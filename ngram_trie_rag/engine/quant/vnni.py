"""The w8a8 product of a few rows on an AVX512-VNNI CPU, built once per machine.

Why: a decode step multiplies 1 to 8 rows by every int8 matrix of the model. There
``torch._int_mm`` (oneDNN) costs about as much at 1 row as at 9, and the activations'
rounding around it is eight more tensor operations per layer. :file:`w8a8_vnni.cpp`
does both in one call (``vpdpbusd`` over the layer's own (N, K) int8 weights, no
copy). The 121 products a step of the default model runs, 2 threads of a Xeon with
AVX512-VNNI: 9 ms at one row, 15.5 ms at five, 22.6 ms at eight, against 22-26 ms
through the Python path at 1 to 8 rows. From about ten rows oneDNN is the faster
(its cost hardly grows with the rows), so products of more than :data:`MAX_ROWS` rows,
a prompt's included, stay there.

Same bits: the kernel runs the Python path's IEEE operations in its order, and its
integer sums are exact in any order, so a row's output is bitwise
:func:`~.kernels.int8_dynamic_product`'s (``tests/test_w8a8_vnni.py``). Which of the
two runs a product changes its time, never a token.

The C++ (no PyTorch headers, OpenMP for its threads) is compiled by the system's C++
compiler (``$CXX``, else ``c++``) the first time a model is quantized to w8a8 on a
machine, in about 2 s, into this package's cache (``kernels/`` under
``$NGRAM_TRIE_RAG_CACHE``), and loaded with ctypes from there after that. Its OpenMP is
PyTorch's (the same ``libgomp.so.1``, loaded with torch), its team the size of
PyTorch's intra-op threads at each call. Where the CPU has no AVX512-VNNI the Python
path runs; where the compiler is missing or fails, a warning names the reason and the
Python path runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from ...util.cache_paths import cache_dir

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


def library_path(compiler: str) -> Path:
    """Where the kernel built by ``compiler`` is cached: named by the source and flags."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join((compiler, *FLAGS)).encode())
    return cache_dir() / "kernels" / f"w8a8_vnni_{key.hexdigest()[:16]}.so"


def _build() -> Product | None:
    compiler = os.environ.get("CXX", "c++")
    path = library_path(compiler)
    try:
        function = _load(compiler, path)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        log.warning("the w8a8 VNNI kernel is not available (%s); w8a8 products run through "
                    "torch._int_mm, with the same results, slower at 1-8 rows",
                    detail.strip().splitlines()[-1] if detail.strip() else type(error).__name__)
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


def _load(compiler: str, path: Path) -> ctypes._CFuncPtr:
    """The kernel's function from ``path``, compiled first where there is none, and again
    where the file there does not load (cut short or damaged)."""
    if path.is_file():
        try:
            return ctypes.CDLL(str(path)).ntr_w8a8_product
        except OSError as error:
            log.warning("the cached w8a8 VNNI kernel %s does not load (%s): compiling it "
                        "again", path, error)
    _compile(compiler, path)
    return ctypes.CDLL(str(path)).ntr_w8a8_product


def _compile(compiler: str, path: Path) -> None:
    """Compile :data:`SOURCE` to ``path``: into a temporary file beside it, then renamed,
    so a process that finds ``path`` finds it whole."""
    if shutil.which(compiler) is None:
        raise OSError(f"no C++ compiler {compiler!r} on PATH (set CXX to one)")
    log.info("compiling the w8a8 VNNI kernel into %s (once per machine)", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(built, path)
