"""CUDA-graph trees on a thread of the engine's own.

``torch.compile(mode="reduce-overhead")`` keeps its CUDA graphs in trees looked up in
thread-local state. torch before 2.13 sets that state up only in the thread that imported
Inductor's module and in autograd's own threads (which inherit it), so a first compiled
call from any other thread, such as the static engine's compile thread, fails on a bare
``assert``; so would a request run on a worker thread (a LangChain batch's pool, a web
server's). torch 2.13 gives every new thread trees of its own; this does the same on
older versions. The graphs a thread records are its own: the compile thread only warms
shapes up (a tree records on a shape's second call), and each thread that runs requests
records and replays its graphs in its own tree, with its own memory pool.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import torch


def cudagraph_trees_for_this_thread() -> None:
    """Give the calling thread its own CUDA-graph trees when it has none."""
    from torch._inductor import cudagraph_trees as trees

    if hasattr(trees.local, "tree_manager_containers"):
        return
    if torch._C._is_key_in_tls("tree_manager_containers"):  # inherited, as autograd's are
        return
    trees.local.tree_manager_containers = {}
    trees.local.tree_manager_locks = defaultdict(threading.Lock)
