"""The verification cost curve runs end to end on the CPU at tiny sizes (the GPU run
uses the same code at the shapes users run)."""

from __future__ import annotations

import numpy as np
import torch

from ngram_trie_rag.bench import cost_curve


def test_draft_trees_keep_the_engine_invariants() -> None:
    rng = np.random.default_rng(0)
    chain = cost_curve.draft_tree("chain", 5, rng)
    assert chain.parents.tolist() == [-1, 0, 1, 2, 3] and chain.depths.tolist() == [1, 2, 3, 4, 5]
    tree = cost_curve.draft_tree("tree", 40, rng)
    assert all(p < i for i, p in enumerate(tree.parents))
    assert all(tree.depths[i] == (1 if p < 0 else tree.depths[p] + 1)
               for i, p in enumerate(tree.parents))


def test_measure_covers_every_point() -> None:
    points = cost_curve.measure("tiny-llama", device=torch.device("cpu"), dtype=torch.float32,
                                contexts=(16, 32), sizes=(1, 4), warmup=1, repeats=2)
    keys = {(p.context, p.kind, p.draft) for p in points}
    assert keys == {(c, "plain", 0) for c in (16, 32)} | {
        (c, k, s) for c in (16, 32) for k in ("chain", "tree") for s in (1, 4)}
    assert all(p.ms > 0 and p.ratio > 0 for p in points)
    table = cost_curve.table(points)
    assert table.count("| tiny-llama |") == 4 and "K=4" in table
