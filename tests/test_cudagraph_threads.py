"""A thread other than the importing one gets CUDA-graph trees of its own (torch before
2.13 stopped such a thread's first compiled call on a bare assert). The lookup itself
needs no CUDA; ``make test-gpu`` runs the graphs."""

from __future__ import annotations

import threading

from torch._inductor import cudagraph_trees as trees

from ngram_trie_rag.engine.compiling.cudagraph_threads import cudagraph_trees_for_this_thread


def _as_before_2_13(local) -> None:
    raise AssertionError  # what torch before 2.13 did for a thread without trees


def test_each_thread_gets_trees_of_its_own_and_keeps_them(monkeypatch) -> None:
    # torch 2.13 would set a new thread up itself: make it behave as earlier versions did
    monkeypatch.setattr(trees, "_initialize_tls", _as_before_2_13, raising=False)
    cudagraph_trees_for_this_thread()  # the importing thread: its own trees stay
    main = trees.get_obj(trees.local, "tree_manager_containers")
    seen = []

    def worker() -> None:
        cudagraph_trees_for_this_thread()
        containers = trees.get_obj(trees.local, "tree_manager_containers")
        cudagraph_trees_for_this_thread()  # a second call keeps them
        seen.append((containers, trees.get_obj(trees.local, "tree_manager_containers")))
        seen.append(trees.get_container(0).device_index)  # the lookup a compiled call makes

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    (first, again), device = seen
    assert first is again and first is not main and device == 0
    assert trees.get_obj(trees.local, "tree_manager_containers") is main
