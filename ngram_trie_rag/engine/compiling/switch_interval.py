"""A short interpreter switch interval while a background compile runs.

PyTorch gives up Python's interpreter lock inside every operator, and a thread that
wants the lock back waits until the thread holding it lets go, at the latest after
``sys.getswitchinterval()`` (5 ms by default). An eager decoding step launches about
1,400 operators (a 30-layer model), so while a compile thread traces and generates code
in Python beside it, every operator of the answer can wait that long. Measured on the
default model's shape, the first answer of the compiled engine decoded eagerly while its
shapes compiled beside it (32 tokens, 2.4-3.0 s with nothing compiling, 2-core CPU):
11.5-31.1 s under 5 ms (4 runs), 15.8 s under 0.1 ms, 7.7-8.5 s under 20 us (3 runs)
and 8.0 s under 5 us; the compile took 89-100 s under every interval. Through this
module (``scripts/compile_overlap.py``): 6.6 and 7.5 s, against 25.7 s with 5 ms held.
On an H200 a 64-token answer took 67 s beside the compile under 5 ms; on an H100, 16 s
under 0.1 ms.

The interval is process-wide, so it is shortened only while a compile runs and put back
when the last one ends, unless someone else changed it meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

COMPILE_SWITCH_INTERVAL_S = 2e-5

_guard = threading.Lock()
_active = 0  # compiles running
_saved: float | None = None  # the interval to put back, when it was shortened
_ours: float | None = None  # the shortened interval as the interpreter reads it back


@contextlib.contextmanager
def short_switch_interval(interval: float | None = None) -> Iterator[None]:
    """Hold the interpreter's switch interval at most ``interval`` seconds (default
    :data:`COMPILE_SWITCH_INTERVAL_S`, read at the call) inside, for as long as any
    thread is inside."""
    global _active, _saved, _ours
    interval = COMPILE_SWITCH_INTERVAL_S if interval is None else interval
    with _guard:
        _active += 1
        if _active == 1 and sys.getswitchinterval() > interval:
            _saved = sys.getswitchinterval()
            sys.setswitchinterval(interval)
            _ours = sys.getswitchinterval()  # stored in microseconds: reads back inexact
    try:
        yield
    finally:
        with _guard:
            _active -= 1
            if _active == 0:
                if _saved is not None and sys.getswitchinterval() == _ours:
                    sys.setswitchinterval(_saved)
                _saved = _ours = None
