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
- ``auto``: on CUDA the eager engine until the process has answered once, then the
  compiled engine for every request that fits its cache once its shapes are compiled in
  the background (:mod:`~ngram_trie_rag.engine.auto`); the eager engine throughout on a
  CPU (measured: compiling did not pay) and where the compiled one does not apply.

``capacity`` sizes the cache of the engines that preallocate one (every name but
``eager``): the positions a request's prompt and answer may fill, and for a compiling
engine the one cache size it compiles for.
"""

from __future__ import annotations

import torch

from .eager import engine_for
from .engine_names import UNIFORM_NODES, check_capacity, check_engine
from .protocol import Engine

__all__ = ["check_engine", "make_engine"]


def make_engine(model: torch.nn.Module, name: str = "auto",
                capacity: int | None = None) -> Engine:
    """The engine ``name`` for ``model`` (a cache of ``capacity`` positions where it
    preallocates one); generators naming the same one share it."""
    capacity = check_capacity(capacity, check_engine(name))
    if name == "eager":
        return engine_for(model)
    if name == "auto":
        from .auto import auto_engine_for

        return auto_engine_for(model, capacity)
    from .static_engine import static_engine_for

    if name == "uniform":
        return static_engine_for(model, uniform=UNIFORM_NODES, capacity=capacity)
    if name == "uniform-compiled":
        return static_engine_for(model, compiled=True, uniform=UNIFORM_NODES, background=False,
                                 capacity=capacity)
    return static_engine_for(model, compiled=name == "compiled", capacity=capacity)
