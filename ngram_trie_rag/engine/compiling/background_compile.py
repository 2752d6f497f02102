"""Compile step shapes on a background thread, so that compiling never holds an answer.

``torch.compile`` compiles a graph on its first call, and a first call takes 10-60 s per
shape (Inductor's code generation and C++ or Triton builds). A static engine needs a
graph per (tree bucket, cache size), so compiling on first use would stall the first
answers for minutes. Instead the engine asks for a cache size's shapes here and keeps
answering eagerly; one daemon thread compiles them by calling the compiled step on
scratch inputs of the same shapes, and the engine switches to the compiled step for the
requests that start once every shape of their cache size is ready.

Inductor keeps what it compiled in its on-disk cache (``TORCHINDUCTOR_CACHE_DIR``), so
the next process pays only for tracing, a few seconds a shape.

The thread ends once nothing is queued (a later request starts another). A thread that
has run a parallel region keeps an OpenMP thread team for as long as it lives, and with
more OpenMP threads in the process than cores, libgomp stops spinning between parallel
regions: every later step, compiled or not, then waits for its worker threads to wake
at each of its hundreds of regions. Measured on 2 cores after a background compile of
the Qwen2-shaped default-size model, while the idle compile thread lived, summing every
weight once took 30-33 ms instead of 19-24, and a plain step's transposed linear
products 40-57 ms instead of 20-21; with the thread ended, as before the compile. A
compile of many shapes runs a scratch step after each, so both compiling engines (the
static one and the batched step) let the thread's team go after each one
(:func:`~ngram_trie_rag.engine.cpu.openmp_team.release`) rather than keep it through the
minutes the next shape takes.

The thread runs at the lowest CPU priority (nice 19 on Linux, where priority is per
thread; the compiler processes it starts inherit it), so the answers beside it get the
cores first and the compile takes what they leave.

At interpreter exit the thread is stopped between two shapes and joined (a daemon thread
still inside torch's C++ code when the interpreter ends it aborts the whole process):
a script that exits mid-compile waits for the shape being compiled, with a notice.

A key that fails to compile stays eager, with a one-line notice on stderr; it is not
retried. While a key compiles, the interpreter's switch interval is short, so that the
eager answers beside it are not held at every operator (:mod:`.switch_interval`), and
the compile takes the interpreter a quarter of the time while an answer runs
(:mod:`.yield_to_answers`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from pathlib import Path

from .switch_interval import short_switch_interval
from .yield_to_answers import yielding_to

_STOPPING = threading.Event()  # set at interpreter exit: no compile step starts after it
_COMPILERS: weakref.WeakSet = weakref.WeakSet()


class CompileStopped(Exception):
    """Raised between two compile steps once the interpreter is exiting."""


def check_not_stopping() -> None:
    """Raise :class:`CompileStopped` once the interpreter is exiting (a compiler calls it
    between shapes)."""
    if _STOPPING.is_set():
        raise CompileStopped


@atexit.register
def _stop_all() -> None:
    """Let no compile step start, and wait for the ones running to end."""
    _STOPPING.set()
    threads = [t for c in list(_COMPILERS) if (t := c._thread) is not None and t.is_alive()]
    if threads:
        print("ngram-trie-rag: finishing the step shape being compiled before exiting",
              file=sys.stderr, flush=True)
    for thread in threads:
        thread.join()


class BackgroundCompiler:
    """Runs ``compile_key(key)`` once per requested key, in request order, on one daemon
    thread while any is pending. ``ready(key)`` is True once it has returned.
    ``busy()``: whether an answer is running, which the compile then yields to (see
    :mod:`.yield_to_answers`)."""

    def __init__(self, compile_key: Callable[[Hashable], None], what: str = "shapes",
                 busy: Callable[[], bool] = lambda: False) -> None:
        self._compile_key = compile_key
        self._busy = busy
        self._what = what
        self._pending: deque[Hashable] = deque()  # requested, not yet started
        self._ready: set[Hashable] = set()
        self._failed: dict[Hashable, str] = {}
        self._requested: set[Hashable] = set()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        _COMPILERS.add(self)

    def ready(self, key: Hashable) -> bool:
        return key in self._ready

    def failed(self, key: Hashable) -> str | None:
        """Why ``key`` could not be compiled, or None."""
        return self._failed.get(key)

    def idle(self) -> bool:
        """True when no key is queued or compiling."""
        with self._guard:
            return self._requested <= self._ready | self._failed.keys()

    def request(self, key: Hashable) -> None:
        """Queue ``key`` unless it was asked for before (ready, failed or pending)."""
        with self._guard:
            if key in self._requested:
                return
            self._requested.add(key)
            self._pending.append(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="ngram-trie-rag-compile",
                                                daemon=True)
                self._thread.start()

    def wait(self, key: Hashable, timeout: float | None = None) -> bool:
        """Request ``key`` and block until it is compiled (True) or failed or ``timeout``
        seconds passed (False)."""
        self.request(key)
        with self._done:
            self._done.wait_for(lambda: key in self._ready or key in self._failed, timeout)
        return key in self._ready

    def _work(self) -> None:
        _lowest_priority()
        while True:
            with self._guard:
                if not self._pending or _STOPPING.is_set():  # end it, and its OpenMP team
                    self._thread = None
                    return
                key = self._pending.popleft()
            try:
                with short_switch_interval(), yielding_to(self._busy):
                    self._compile_key(key)
            except CompileStopped:
                continue  # the loop ends the thread
            except Exception as exc:  # noqa: BLE001 - any failure leaves the key eager
                where = traceback.extract_tb(exc.__traceback__)[-1]  # the raising frame
                self._failed[key] = (f"{type(exc).__name__}: {exc}".splitlines()[0]
                                     + f" at {Path(where.filename).name}:{where.lineno}")
                if threading.main_thread().is_alive():  # not the interpreter shutting down
                    print(f"ngram-trie-rag: compiling the {self._what} for {key} failed "
                          f"({self._failed[key]}); they run eagerly", file=sys.stderr)
            else:
                self._ready.add(key)
            with self._done:
                self._done.notify_all()


def _lowest_priority() -> None:
    """Nice 19 for the calling thread (Linux: per thread); elsewhere nothing."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # a sandbox may refuse: the compile runs at normal priority
            pass
