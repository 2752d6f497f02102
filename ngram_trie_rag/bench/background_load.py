"""A busy host on demand: CPU-bound processes that run beside a benchmark.

Speed-ups measured on a quiet machine say little about a shared one, where another job
takes cores away at random moments and timing-based choices (linear layout, packed
attention, the draft budget) can turn wrong. ``bench --background-load N`` reproduces
that: N processes, each spinning one core in a pure-Python loop (no memory traffic of
note, so it competes for cores, not bandwidth), from before the model is loaded until
the run ends. Every method runs under the same load, interleaved per prompt.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator
from contextlib import contextmanager


def _spin(stop: mp.Event, parent: int) -> None:  # type: ignore[valid-type]
    """Busy-loop until ``stop`` is set or the benchmark process is gone (killed before
    it could set ``stop``: a spinner must not outlive it), checked every few million
    additions."""
    while not stop.is_set() and os.getppid() == parent:
        total = 0
        for i in range(2_000_000):
            total += i


@contextmanager
def background_load(processes: int) -> Iterator[int]:
    """Run ``processes`` spinning processes while the block runs; yields their count."""
    if processes < 0:
        raise ValueError(f"background load must be >= 0 processes, got {processes}")
    context = mp.get_context("spawn")  # no copy of a loaded model in the children
    stop = context.Event()
    workers = [context.Process(target=_spin, args=(stop, os.getpid()), daemon=True)
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        yield processes
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():  # still starting up, or starved: stop it outright
                worker.terminate()
                worker.join()
