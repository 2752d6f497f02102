"""A hardware-aware draft budget: verify the tree size that maximises tokens per second.

Verifying K draft nodes costs one forward over 1 + K tokens, t(1 + K). On a GPU t is
nearly flat up to a few dozen tokens; on a CPU it is not (fp32, default model, two
cores, the generator's forwards: about 19 / 21 / 27 / 33 / 41 ms for 1 / 2 / 3 / 8 /
16 tokens). So the best K depends on the hardware and on how likely this step's
candidates are to be right:

    K* = argmax_K  (1 + sum_{rank(i) < K} p_i) / t(1 + K)     (K = 0: a plain step)

where p_i is the probability that candidate node i is accepted. A node's p is read
from a table learned online, bucketed by the match length of the step, the node's
depth and its share of the matched subtree's frequency. Greedy verification reveals
the model's token after each accepted node, so every candidate -- verified or not --
is labelled after each step (accepted, rejected, or unknown when it lies below the
last emitted token), and the table learns for all of them at no extra compute.

``t`` is the model's latency curve (:mod:`ngram_trie_rag.engine.costs.latency`), refined from the
real steps' timings; :meth:`DraftBudget.refined` hands the refined sizes back, so that
the next budget, and the next process, start from them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .draft_tree import DraftTree

SHARE_BINS = np.array([0.1, 0.33, 0.66, 0.99])  # share of the subtree's frequency
MAX_DEPTH_BUCKET = 8
MAX_MATCH_BUCKET = 3
MAX_STEP_RATIO = 3.0  # a step's ratio to the curve counts at most this far from 1
# Every EXPLORE_EVERY-th choice is made as if verifying cost PRIOR_SLOPE of a plain step
# per extra token (about a CPU's cost in fp32): a curve that makes drafts look dear (one
# timed on a busy host) would otherwise never see a draft step again to correct it.
EXPLORE_EVERY = 8
PRIOR_SLOPE = 0.1


class DraftBudget:
    """Chooses how many ranked candidates to verify each step."""

    def __init__(self, latency: dict[int, float], max_draft: int,
                 prior_weight: float = 2.0) -> None:
        self.max_draft = max_draft
        self.latency = _monotone(_bounded(latency))  # tokens in the forward (1 + K) -> seconds
        self.timed: set[int] = set()  # sizes of latency that real steps have moved
        self.choices = 0  # choose() calls with candidates, for exploring
        shape = (MAX_MATCH_BUCKET + 1, MAX_DEPTH_BUCKET + 1, SHARE_BINS.size + 1)
        # Prior: a confident, shallow node is often right; deep, rare ones seldom.
        depth = np.arange(shape[1])[None, :, None]
        share = (np.arange(shape[2]) / (shape[2] - 1))[None, None, :]
        prior = np.clip(0.55 * (0.3 + 0.7 * share) * 0.85 ** np.maximum(depth - 1, 0), 0.02, 0.9)
        self.accepted = np.broadcast_to(prior * prior_weight, shape).copy()
        self.seen = np.full(shape, prior_weight)

    def cost(self, k: int) -> float:
        """t(1 + k), interpolated linearly between measured sizes."""
        return interpolated(self.latency, 1 + k)

    def record_latency(self, tokens: int, seconds: float) -> None:
        """Refine t from a real step (context grows, machines get busy): t(tokens) moves
        a tenth of the way to ``seconds``; a size between two of the curve's moves them
        both, in proportion to their nearness, by the step's ratio to the interpolated
        t (the curve holds a few sizes, the budget picks any). Larger sizes no step has
        timed yet move by the same ratio: a cautious starting curve keeps its shape at
        the real scale, rather than making the sizes beyond those tried look dear. The
        ratio counts up to ``MAX_STEP_RATIO`` either way: one step stalled by another
        process (seconds instead of milliseconds) must not set a curve that is kept."""
        ratio = seconds / interpolated(self.latency, tokens)
        ratio = min(max(ratio, 1.0 / MAX_STEP_RATIO), MAX_STEP_RATIO)
        # Faster than the curve says is proof the host can (noise only ever slows a
        # step down): taken at once. Slower moves a tenth of the way (load comes and goes).
        step = ratio - 1.0 if ratio < 1.0 else 0.1 * (ratio - 1.0)
        near = ([(tokens, 1.0)] if tokens in self.latency
                else _neighbours(sorted(self.latency), tokens))
        untimed = [q for q in self.latency if q > tokens and q not in self.timed]
        for size, weight in near:
            self.latency[size] *= 1.0 + weight * step
            self.timed.add(size)
        for size in untimed:
            if size not in self.timed:
                self.latency[size] *= 1.0 + step

    def refined(self) -> dict[int, float]:
        """t of the sizes real steps have refined (forward size -> seconds)."""
        return {q: self.latency[q] for q in sorted(self.timed)}

    def _buckets(self, tree: DraftTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        top = tree.depths == 1
        total = max(float(tree.frequencies[top].sum()), 1.0)
        share = np.digitize(tree.frequencies / total, SHARE_BINS)
        depth = np.minimum(tree.depths, MAX_DEPTH_BUCKET)
        match = np.minimum(tree.node_matches(), MAX_MATCH_BUCKET)
        return match, depth, share

    def probabilities(self, tree: DraftTree) -> np.ndarray:
        """(N,) estimated probability that each candidate is accepted."""
        idx = self._buckets(tree)
        return self.accepted[idx] / self.seen[idx]

    def ranked_probabilities(self, tree: DraftTree) -> np.ndarray:
        """(N,) :meth:`probabilities` in rank order (best-ranked candidate first)."""
        p = np.zeros(len(tree))
        p[tree.ranks()] = self.probabilities(tree)
        return p

    def choose(self, tree: DraftTree) -> int:
        """How many of ``tree``'s ranked candidates to verify (0: a plain step)."""
        n = min(len(tree), self.max_draft)
        if n == 0:
            return 0
        p = self.ranked_probabilities(tree)
        gain = 1.0 + np.concatenate(([0.0], np.cumsum(p[:n])))  # expected tokens, K = 0..n
        self.choices += 1
        if self.choices % EXPLORE_EVERY == 0:  # the prior's cost, so every size gets timed
            cost = 1.0 + PRIOR_SLOPE * np.arange(n + 1)
        else:
            cost = np.array([self.cost(k) for k in range(n + 1)])
        return int(np.argmax(gain / cost))

    def observe(self, tree: DraftTree, emitted: Sequence[int]) -> None:
        """Label every candidate from one step's emitted tokens and update the table."""
        if not len(tree):
            return
        path = tree.path_nodes(list(emitted))
        label = np.zeros(len(tree))  # 1 accepted, 0 rejected
        label[path] = 1.0
        known = np.ones(len(tree), dtype=bool)
        if len(path) == len(emitted):  # the candidates cover even the bonus token:
            known &= ~tree.descendants(path[-1])  # what lies below it is unknown
        idx = tuple(b[known] for b in self._buckets(tree))
        np.add.at(self.accepted, idx, label[known])
        np.add.at(self.seen, idx, 1.0)


def interpolated(curve: dict[int, float], q: int) -> float:
    """``curve`` (forward size -> seconds) at ``q``: measured, linear between measured
    sizes, in proportion below the smallest and past the largest."""
    if q in curve:
        return curve[q]
    points = sorted(curve)
    lo = max((p for p in points if p <= q), default=points[0])
    hi = min((p for p in points if p >= q), default=points[-1])
    if hi == lo:
        return curve[lo] * q / lo
    w = (q - lo) / (hi - lo)
    return curve[lo] * (1 - w) + curve[hi] * w


def _neighbours(sizes: Sequence[int], q: int) -> list[tuple[int, float]]:
    """The sizes of a curve that a step of ``q`` tokens (not itself a size) informs, with
    weights: the two around it by nearness, or the nearest one outside the range."""
    below = [p for p in sizes if p < q]
    above = [p for p in sizes if p > q]
    if not below or not above:
        return [(below[-1] if below else above[0], 1.0)]
    lo, hi = below[-1], above[0]
    w = (q - lo) / (hi - lo)
    return [(lo, 1.0 - w), (hi, w)]


def _bounded(curve: dict[int, float]) -> dict[int, float]:
    """``curve`` with no forward of q tokens dearer than q plain steps (which would
    make the same tokens one by one): a larger figure was timed while something else
    held the cores."""
    if 1 not in curve:
        return dict(curve)
    return {q: min(t, q * curve[1]) for q, t in curve.items()}


def _monotone(curve: dict[int, float]) -> dict[int, float]:
    """The nearest non-decreasing curve (least squares, pool adjacent violators).

    A forward of more tokens is taken to never cost less. Not physics: with the stock
    linear layout a forward of 2 or 3 tokens cost more than one of 4 to 8 in fp32 on a
    CPU (the measured layout choice now removes most of that), and using the raw,
    non-monotone curve made the budget pick smaller trees on long copied spans (1.21x
    vs 1.39x-1.45x decode speed-up in full Spec-Bench RAG harness runs). A monotone
    curve is kept; it is fitted rather than a running maximum because one forward
    timed in a busy moment (on a loaded two-core machine, 148 ms for 15 tokens beside
    100 ms for 16) would otherwise raise every larger size to it, and the budget would
    then shy away from trees that cost no more than a plain step.
    """
    sizes = sorted(curve)
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for q in sizes:
        blocks.append([curve[q], 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [b[0] / b[1] for b in blocks for _ in range(int(b[1]))]
    return dict(zip(sizes, fitted, strict=True))
