"""One OpenMP team in the process: a thread whose forwards are done lets its team go.

PyTorch's CPU operators run their parallel regions on libgomp, the OpenMP runtime its
Linux wheels ship. Every thread that has run a parallel region keeps a team of worker
threads for as long as it lives, and libgomp counts the workers of every team: once the
process holds more of them than there are cores, a worker waiting at a barrier spins
about a thousand times (not some hundred thousand) before it sleeps in the kernel, so
each of a step's hundreds of parallel regions waits for threads to wake. Two threads
that each ran a forward are enough on two cores, even when only one computes at a time:

- the batch scheduler's thread runs every forward, while the thread that loaded the
  model keeps the team its weight copies started;
- the wrappers' async calls run on a pool of threads (and callers bring their own), one
  request on one thread, the next on another.

Measured on two cores (default model, fp32, 4 Spec-Bench RAG prompts, 128 new tokens,
``trie``): through the batch scheduler 20.0-21.7 tok/s end to end, 27.6-34.9 with the
loading thread's team let go; generator calls one at a time from a thread pool
20.9-23.1 tok/s, 30.9-32.9 with each thread's team let go when its answer ends, as fast
as calls from one thread.

:func:`release` lets the calling thread's team go in every libgomp the process loaded
(``omp_pause_resource_all``, OpenMP 5.0); its next parallel region starts a new one,
which costs tens of microseconds. So a request releases its thread's team when it ends,
a generator the team of the thread that built it, and a batch scheduler that of the
thread that started it, and a compile thread its own after each step shape. Only libgomp
on Linux is handled: other runtimes (LLVM's libomp, Intel's) put idle workers to sleep
on a timer of their own, and where no OpenMP runtime is loaded there is nothing to let
go.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: threads released, state kept

_pauses: list[Callable[[int], int]] = []
_looked = False


def _libgomp_pauses() -> list[Callable[[int], int]]:
    """``omp_pause_resource_all`` of every libgomp the process has loaded (looked up once
    torch is imported). Each copy keeps its own teams: torch's, and another package's
    bundled one (sentencepiece's wheel ships one) that torch's operators never use."""
    global _looked
    if _looked or "torch" not in sys.modules:
        return _pauses
    _looked = True
    if not sys.platform.startswith("linux"):
        return _pauses
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "libgomp" in line and line.rstrip().split()[-1].startswith("/")})
    except OSError:
        return _pauses
    for path in paths:
        try:
            function = ctypes.CDLL(path, mode=os.RTLD_NOLOAD).omp_pause_resource_all
        except (OSError, AttributeError):  # not loaded after all; libgomp before GCC 9
            continue
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_int
        _pauses.append(function)
    return _pauses


def release() -> bool:
    """Let the calling thread's OpenMP teams go; True when libgomp did. Call it between
    operators (never inside one), on a thread whose forwards are done for now."""
    codes = [pause(OMP_PAUSE_SOFT) for pause in _libgomp_pauses()]  # each one, always
    return bool(codes) and not any(codes)
