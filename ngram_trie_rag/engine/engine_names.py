"""The engines a generator can run on, by name (see ``choice``), and the checks of the
two settings that pick one (``engine=``, ``capacity=``); no torch, so the command line's
parser and the wrappers' validators can use them."""

from __future__ import annotations

import difflib

ENGINES = ("auto", "eager", "static", "compiled", "uniform", "uniform-compiled")
UNIFORM_NODES = 32  # ``uniform``: every step's tree size (the drafters' default num_draft)
PREALLOCATING = ("auto", "static", "compiled", "uniform", "uniform-compiled")  # take capacity
MIN_CAPACITY = 128  # positions: a prompt, an answer and the largest step (65 rows) must fit
# ``serve --engine local``: our own OpenAI server over the local engine instead of vLLM's.
# A value of ``serve`` alone, never an engine (``check_engine`` refuses it everywhere else).
LOCAL_SERVER = "local"


def check_engine(name: object) -> str:
    """``name`` when it is one of :data:`ENGINES`, else a ValueError naming the nearest
    and the rest."""
    if name not in ENGINES:
        close = difflib.get_close_matches(str(name), ENGINES, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown engine {name!r}{hint}; engine must be one of "
                         f"{', '.join(ENGINES)}")
    return str(name)


def check_capacity(capacity: object, engine: str = "auto") -> int | None:
    """``capacity`` (cache positions a preallocating engine reserves and compiles for)
    when it is None or a whole number of at least :data:`MIN_CAPACITY` that ``engine``
    reads, else a ValueError saying why."""
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise ValueError(f"capacity must be a whole number of cache positions, got {capacity!r}")
    if capacity < MIN_CAPACITY:
        raise ValueError(f"capacity {capacity} is too small: at least {MIN_CAPACITY} positions "
                         "(the prompt, the answer and a verification step)")
    if engine not in PREALLOCATING:
        raise ValueError(f"capacity sizes a preallocated cache, which engine={engine!r} does "
                         "not have (its cache grows as it goes); use it with "
                         f"{', '.join(repr(e) for e in PREALLOCATING)}")
    return capacity
