"""Building this package's C++ kernels once per machine and loading them with ctypes.

A kernel is one C++ file with no PyTorch headers (OpenMP for its threads), which may
include the headers beside it. The system's
C++ compiler (``$CXX``, else ``c++``) builds it the first time a process needs it, in
about 2 s, into this package's cache (``kernels/`` under ``$NGRAM_TRIE_RAG_CACHE``),
named by a hash of the source, the compiler and the flags; later processes load that
file. A file that does not load (cut short, damaged) is compiled again. Its OpenMP is
PyTorch's own (the same ``libgomp.so.1``, already loaded with torch).
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
from typing import TypeVar

import torch

from ...util.cache_paths import cache_dir

T = TypeVar("T")


def x86_with(*flags: str) -> bool:
    """True on an x86-64 CPU where ``torch.cpu.get_capabilities()`` reports every one of
    ``flags`` (``"avx512_f"``, ...): the instructions a kernel is compiled for."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    found = torch.cpu.get_capabilities()
    return all(found.get(flag, False) for flag in flags)


def once(cell: list, lock: threading.Lock, build: Callable[[], T]) -> T:
    """``build()``'s result, computed by the first caller in the process and kept in
    ``cell`` (``[]`` until then; a test empties it to start again); thread-safe."""
    if cell:
        return cell[0]
    with lock:
        if not cell:
            cell.append(build())
    return cell[0]


def weight_product(function: ctypes._CFuncPtr
                   ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None],
                                 torch.Tensor]:
    """The Python side of a weight-only product kernel ``f(x, rows, K, weights, N,
    scales, y, threads)`` (W8A32's, W4A32's and W32A32's): ``product(x, weights,
    scales)`` with x (M, K) fp32, the weights' first dimension N, all contiguous on the
    CPU, scales None for a kernel that reads none (fp32 weights); y (M, N) fp32,
    computed by a team of PyTorch's intra-op thread count."""
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]

    def product(x: torch.Tensor, weights: torch.Tensor,
                scales: torch.Tensor | None) -> torch.Tensor:
        rows, n = x.shape[0], weights.shape[0]
        y = x.new_empty((rows, n))
        function(x.data_ptr(), rows, x.shape[1], weights.data_ptr(), n,
                 None if scales is None else scales.data_ptr(), y.data_ptr(),
                 torch.get_num_threads())
        return y

    return product


def compiler() -> str:
    """The C++ compiler kernels are built with: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


def library_path(source: Path, flags: tuple[str, ...], compiler: str) -> Path:
    """Where ``source`` built by ``compiler`` with ``flags`` is cached: named by them and
    by the headers beside it (``lanes.h``), so a changed header builds anew."""
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(source.read_bytes() + headers
                         + " ".join((compiler, *flags)).encode())
    return cache_dir() / "kernels" / f"{source.stem}_{key.hexdigest()[:16]}.so"


def load(source: Path, flags: tuple[str, ...], symbol: str,
         log: logging.Logger) -> ctypes._CFuncPtr:
    """The function ``symbol`` of ``source``, built first where no cached build loads.
    Raises OSError or subprocess.SubprocessError when it cannot be built."""
    cxx = compiler()
    path = library_path(source, flags, cxx)
    if path.is_file():
        try:
            return getattr(ctypes.CDLL(str(path)), symbol)
        except OSError as error:
            log.warning("the cached kernel %s does not load (%s): compiling it again",
                        path, error)
    _compile(cxx, source, flags, path, log)
    return getattr(ctypes.CDLL(str(path)), symbol)


def why(error: Exception) -> str:
    """The last line of a failed build's message, for the warning that names it."""
    detail = (getattr(error, "stderr", "") or str(error)).strip()
    return detail.splitlines()[-1] if detail else type(error).__name__


def _compile(cxx: str, source: Path, flags: tuple[str, ...], path: Path,
             log: logging.Logger) -> None:
    """Compile into a temporary file beside ``path``, then rename it, so a process that
    finds ``path`` finds it whole."""
    if shutil.which(cxx) is None:
        raise OSError(f"no C++ compiler {cxx!r} on PATH (set CXX to one)")
    log.info("compiling %s into %s (once per machine)", source.name, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        subprocess.run([cxx, *flags, "-o", str(built), str(source)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(built, path)
