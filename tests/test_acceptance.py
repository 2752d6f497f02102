"""The tensor acceptance walk equals the host walk, keeps the sampling distribution,
never accepts padding, and compiles to one fixed-shape graph."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ngram_trie_rag.decoding.sampling import SamplingParams, probabilities
from ngram_trie_rag.drafting.draft_tree import DraftTree
from ngram_trie_rag.engine import acceptance
from ngram_trie_rag.engine.acceptance import accept_on_device, row_choices, tree_tensors
from ngram_trie_rag.engine.acceptance import host_walk as host_accept
from ngram_trie_rag.engine.trees.tree_buckets import BUCKETS, bucket_for, pad_tree

V = 12
GREEDY = SamplingParams()
PROPERTY = settings(max_examples=150, deadline=None)


@st.composite
def trees(draw: st.DrawFn, max_nodes: int = 20) -> DraftTree:
    """Pre-order trees with distinct sibling tokens, as the trie drafts them."""
    n = draw(st.integers(0, max_nodes))
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    used: dict[int, set[int]] = {}  # parent -> its children's tokens
    stack: list[int] = []  # the previous node and its ancestors (pre-order: parent is one)
    for i in range(n):
        stack = stack[: draw(st.integers(0, len(stack)))]
        par = stack[-1] if stack else -1
        free = sorted(set(range(V)) - used.setdefault(par, set()))
        if not free:
            break
        tok = draw(st.sampled_from(free))
        used[par].add(tok)
        stack.append(i)
        tokens.append(tok)
        parents.append(par)
        depths.append(len(stack))
    return DraftTree(np.array(tokens, np.int64), np.array(parents, np.int64),
                     np.array(depths, np.int64))


def crafted_logits(tree: DraftTree, rows: int, seed: int) -> torch.Tensor:
    """(rows, V) random logits where most nodes are their parent row's argmax candidate,
    so deep chains match."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(rows, V))
    for tok, par in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True):
        if rng.random() < 0.75:
            logits[par + 1, tok] += 4 + 4 * rng.random()
    return torch.tensor(logits, dtype=torch.float32)


def host_walk(tree: DraftTree, choices: list[int]) -> tuple[list[int], list[int]]:
    """The host acceptance walk with given per-row choices."""
    children = tree.children()
    tokens: list[int] = []
    path: list[int] = []
    row = 0
    while True:
        tokens.append(choices[row])
        child = children[row].get(choices[row])
        if child is None:
            return tokens, path
        row = child + 1
        path.append(row)


def test_buckets() -> None:
    assert bucket_for(0) == 0
    assert [bucket_for(n) for n in (1, 2, 4, 5, 16, 17, 64)] == [1, 4, 4, 8, 16, 32, 64]
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(65)
    assert bucket_for(5, buckets=(3, 6)) == 6


def test_pad_tree_layout() -> None:
    tree = DraftTree(np.array([5, 6, 7]), np.array([-1, 0, -1]), np.array([1, 2, 1]))
    padded = pad_tree(tree, 8)
    assert (padded.real, padded.max_depth, len(padded)) == (3, 2, 8)
    assert padded.tokens.tolist() == [5, 6, 7] + [-1] * 5
    assert padded.parents.tolist() == [-1, 0, -1] + [-1] * 5
    assert padded.depths.tolist() == [1, 2, 1] + [1] * 5
    anc = padded.ancestors
    assert anc.shape == (9, 9)
    assert anc[:4, 4:].sum() == 0  # no real row sees padding
    assert (anc[4:, 0] & anc[4:, 4:].diagonal()).all() and anc[4:].sum() == 2 * 5
    with pytest.raises(ValueError):
        pad_tree(tree, 2)


@PROPERTY
@given(tree=trees(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_greedy_equals_host(tree: DraftTree, seed: int, data: st.DataObject) -> None:
    n = len(tree)
    size = data.draw(st.sampled_from([n, bucket_for(n)] + [b for b in BUCKETS if b >= n]))
    logits = crafted_logits(tree, 1 + size, seed)
    expected = host_accept(tree, logits[: 1 + n], GREEDY, None)
    assert acceptance.device_walk(tree, logits[: 1 + n], GREEDY, None) == expected
    assert acceptance.device_walk(pad_tree(tree, size), logits, GREEDY, None) == expected


@PROPERTY
@given(tree=trees(), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_walk_with_given_choices(tree: DraftTree, seed: int, data: st.DataObject) -> None:
    """Same per-row choices -> same path, whatever ``max_depth`` bound is used."""
    n = len(tree)
    size = data.draw(st.sampled_from([b for b in (0,) + BUCKETS if b >= n]))
    rng = np.random.default_rng(seed)
    choices = rng.integers(0, V, size=1 + size)
    for tok, par in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True):
        if rng.random() < 0.6:
            choices[par + 1] = tok
    padded = pad_tree(tree, size)
    tokens, ancestors, depths = tree_tensors(padded, "cpu")
    expected = host_walk(tree, choices[: 1 + n].tolist())
    for bound in {padded.max_depth, size}:
        packed = accept_on_device(tokens, ancestors, depths, torch.as_tensor(choices), bound)
        assert packed.shape == (acceptance.packed_size(bound),)
        assert acceptance.unpack(packed.tolist(), bound) == expected
        assert all(row <= n for row in expected[1])  # never a padded row


def test_padding_is_never_accepted() -> None:
    """Root's choice matches no real child: length 0, even with padding all over."""
    tree = DraftTree(np.array([3, 4]), np.array([-1, 0]), np.array([1, 2]))
    padded = pad_tree(tree, 16)
    logits = torch.randn(17, V)
    logits[0, 5] = 20.0  # not in the tree
    assert acceptance.device_walk(padded, logits, GREEDY, None) == ([5], [])
    empty = pad_tree(DraftTree.empty(), 4)  # nothing real at all
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        out = acceptance.device_walk(empty, torch.randn(5, V), SamplingParams(1.0), gen)
        assert len(out[0]) == 1 and out[1] == []


def _exact_prefixes(tree: DraftTree, probs: torch.Tensor, k: int) -> dict[tuple, float]:
    """P(first k emitted tokens) under plain sampling (shorter when the walk stops)."""
    children = tree.children()
    out: dict[tuple, float] = {}

    def walk(row: int, prefix: tuple, prob: float) -> None:
        for tok in range(probs.shape[1]):
            p = prob * float(probs[row, tok])
            child = children[row].get(tok)
            if child is None or len(prefix) + 1 == k:
                out[prefix + (tok,)] = out.get(prefix + (tok,), 0.0) + p
            else:
                walk(child + 1, prefix + (tok,), p)

    walk(0, (), 1.0)
    return out


def test_sampling_keeps_distribution() -> None:
    # node 0 "1" -> nodes 1 "3", 2 "4"; node 3 "2"
    tree = DraftTree(np.array([1, 3, 4, 2]), np.array([-1, 0, 0, -1]), np.array([1, 2, 2, 1]))
    padded = pad_tree(tree, 8)
    params = SamplingParams(temperature=0.9, top_k=6)
    logits = torch.randn(9, V, generator=torch.Generator().manual_seed(0))
    logits[0, [1, 2]] += 1.5
    logits[1, [3, 4]] += 1.5
    probs = probabilities(logits, params)
    draws = 20_000
    gen = torch.Generator().manual_seed(1)
    # One batched draw over all rows of every step, as ``row_choices`` does per step.
    choices = row_choices(logits.repeat(draws, 1), params, gen).view(draws, -1)
    tokens, ancestors, depths = tree_tensors(padded, "cpu")
    walk = torch.vmap(lambda c: accept_on_device(tokens, ancestors, depths, c, 2))
    packed = walk(choices).tolist()
    emitted = [acceptance.unpack(p, 2)[0] for p in packed]
    for k in (1, 2, 3):
        exact = _exact_prefixes(tree, probs, k)
        counts: dict[tuple, int] = {}
        for seq in emitted:
            counts[tuple(seq[:k])] = counts.get(tuple(seq[:k]), 0) + 1
        assert set(counts) <= set(exact)
        worst = max(abs(counts.get(s, 0) / draws - p) for s, p in exact.items())
        assert worst < 0.02, (k, worst)
    # The convenience path runs end to end with a generator.
    for _ in range(50):
        out, path = acceptance.device_walk(padded, logits, params, gen)
        assert out[: len(path)] == [int(t) for t in padded.tokens[[r - 1 for r in path]]]


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("cc")), reason="no C++ compiler")
def test_greedy_compiles_to_one_graph() -> None:
    size = 8

    def step(logits: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor,
             depths: torch.Tensor) -> torch.Tensor:
        return accept_on_device(tokens, ancestors, depths, row_choices(logits, GREEDY, None),
                                size)

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    cases = [DraftTree.chain([3, 4, 5, 6]),
             DraftTree(np.array([1, 3, 4, 2]), np.array([-1, 0, 0, -1]), np.array([1, 2, 2, 1])),
             DraftTree.chain([7, 1, 2, 3, 4, 5, 6, 8])]
    for i, tree in enumerate(cases):
        logits = crafted_logits(tree, 1 + size, seed=i)
        args = (logits, *tree_tensors(pad_tree(tree, size), "cpu"))
        if i == 1:
            torch.compiler.set_stance("fail_on_recompile")
        try:
            got = compiled(*args)
        finally:
            torch.compiler.set_stance("default")
        assert torch.equal(got, step(*args))
        assert acceptance.unpack(got.tolist(), size) == host_accept(
            tree, logits[: 1 + len(tree)], GREEDY, None)
