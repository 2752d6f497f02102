"""The fixed-shape step's mask and its measurement on a static cache (eager on the CPU;
the compiled side runs in ``scripts/gpu_session.py --parts static``)."""

from __future__ import annotations

import numpy as np
import torch

from ngram_trie_rag.bench import static_step
from ngram_trie_rag.bench.cost_curve import draft_tree
from ngram_trie_rag.engine.trees.tree_attention import tree_inputs


def test_tree_mask_matches_the_engines_ancestor_mask_and_hides_stale_slots():
    rng = np.random.default_rng(3)
    for size in (1, 5, 17):
        tree = draft_tree("tree", size, rng)
        context, length = 11, 11 + 1 + size + 6
        mask = static_step.tree_mask(tree.parents, context, length)[0, 0]
        pos, engine_mask = tree_inputs(tree, context, torch.device("cpu"), torch.float32)
        assert mask.shape == (1 + size, length)
        assert torch.equal(mask[:, : context + 1 + size], engine_mask[0, 0] == 0)
        assert not mask[:, context + 1 + size:].any()  # slots past the tree


def test_eager_points_over_a_static_cache():
    points = static_step.measure("tiny-llama", device=torch.device("cpu"),
                                 dtype=torch.float32, context=16, sizes=(0, 3),
                                 warmup=0, repeats=1, compile_budget_s=-1)
    assert [(p.draft, p.engine) for p in points] == [(0, "eager"), (3, "eager")]
    assert points[0].ratio == 1.0 and all(p.ms > 0 for p in points)
    assert "| tiny-llama | 16 | 3 | eager |" in static_step.table(points)
