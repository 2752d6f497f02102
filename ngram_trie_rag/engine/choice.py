"""Which engine runs a generator's forwards, by name (``engine=`` and ``bench --engine``).

- ``eager``: :class:`~ngram_trie_rag.engine.eager.EagerEngine`, the buffered cache and the
  fastest measured forward of the model's own modules or the direct Llama step.
- ``static``: :class:`~ngram_trie_rag.engine.static_engine.StaticEngine` run eagerly: a
  preallocated cache and trees padded to fixed sizes.
- ``compiled``: the static engine with its step compiled (``torch.compile``, CUDA graphs
  on CUDA), one graph per tree size and cache size, compiled on a background thread while
  requests run eagerly (a request runs wholly compiled once all its shapes are ready).
- ``uniform``: the static engine with every step, plain ones included, padded to
  :data:`~ngram_trie_rag.engine.engine_names.UNIFORM_NODES` nodes: one step shape, so in
  bf16 the drafting methods almost always give plain decoding's tokens (see ``static_engine``).
- ``uniform-compiled``: ``uniform`` with its one step shape compiled, on first use inside
  the request (not in the background: an answer switching from eager to compiled kernels
  would depend in bf16 on when the compile finished).
- ``auto``: the engine's own choice, ``eager``. On a 2-core CPU the compiled step decodes
  2.0-2.5x faster than the eager engine once its shapes are compiled (docs/gpu.md), but
  compiling takes minutes per cache size, and the answers meanwhile run on the static
  engine's eager path, slower than the eager engine's: a one-shot process would pay
  and never collect, so ``compiled`` is for a process that warms up at start-up. On a
  GPU the compiled step is the one built for it, but until it is measured there ``auto``
  stays ``eager`` too (docs/gpu.md).
"""

from __future__ import annotations

import torch

from .eager import engine_for
from .engine_names import ENGINES, UNIFORM_NODES
from .protocol import Engine


def check_engine(name: object) -> str:
    """``name`` when it is one of :data:`ENGINES`, else a ValueError naming them."""
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {name!r}")
    return str(name)


def make_engine(model: torch.nn.Module, name: str) -> Engine:
    """The engine ``name`` for ``model``; generators naming the same one share it."""
    if check_engine(name) in ("auto", "eager"):
        return engine_for(model)
    from .static_engine import static_engine_for

    if name == "uniform":
        return static_engine_for(model, uniform=UNIFORM_NODES)
    if name == "uniform-compiled":
        return static_engine_for(model, compiled=True, uniform=UNIFORM_NODES, background=False)
    return static_engine_for(model, compiled=name == "compiled")
