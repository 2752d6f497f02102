"""While an answer runs, the compile thread takes the interpreter lock a quarter of the time.

A background compile is mostly Python (Dynamo traces the step, Inductor writes its
code), and Python runs one thread at a time: every operator of an eager answer beside it
waits for the interpreter lock (:mod:`.switch_interval` shortens each wait, not their
number). Measured on two cores, the default model's eager answers took 2.8x their time
beside a cold compile with the short switch interval alone (``scripts/default_engine.py``).

So the compile thread runs under a trace function that, while ``busy()`` (a request holds
the model's lock), lets it run :data:`RUN_S` and then sleeps :data:`PAUSE_S`: the answer
has the interpreter at least three quarters of the time, and the compile keeps going at
a quarter of its pace. With no request running it goes at full speed. The check costs
one call per Python function the compile enters; C++ builds (nice 19, see
:mod:`.background_compile`) run outside the interpreter and are not held back.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

RUN_S = 0.004  # the compile runs this long ...
PAUSE_S = 0.012  # ... then sleeps this long, while an answer runs


@contextlib.contextmanager
def yielding_to(busy: Callable[[], bool]) -> Iterator[None]:
    """Inside, the calling thread pauses on the duty cycle above while ``busy()``."""
    started = time.perf_counter()

    def pace(frame, event, arg):  # noqa: ANN001, ANN202 - sys.settrace's signature
        nonlocal started
        now = time.perf_counter()
        if now - started > RUN_S:
            if busy():
                time.sleep(PAUSE_S)  # the interpreter lock goes to the answer
            started = time.perf_counter()
        return None  # no line events: one call per function entered

    previous = sys.gettrace()
    sys.settrace(pace)
    try:
        yield
    finally:
        sys.settrace(previous)
